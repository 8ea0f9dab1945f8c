"""Compares softmax, BN, SH and BN+SH attention in a ViT image classifier.

Trains `vit_classifier` once per attention and seed, then prints the table
(top-1 and top-5 test accuracy, mean ± std over seeds, parameters, training
time, head diversity) and writes to `--output`: results.md, results.json
and results.csv, curves.png (test accuracy per epoch), diversity.png,
maps_<attention>.png (one test image's attention maps) and each trained
model as <attention>_seed<k>.keras.

Default, offline: scikit-learn's 8x8 digits with the `small` preset.
`--dataset cifar10|cifar100|mnist` loads through `keras.datasets` (needs
internet); `--preset deit-tiny` is the paper's model, for a GPU. The
headline is the final epoch's top-1 test accuracy; the best epoch on the
test set is reported beside it, labelled as the paper's protocol.
DeiT's augmentation recipe has its own example, `image_augmentation.py`,
and training over several devices `data_parallel.py`.

    pip install -e ".[jax,examples]"
    KERAS_BACKEND=jax python examples/image_classification.py
    KERAS_BACKEND=jax python examples/image_classification.py --smoke
"""

import os
import time

import _shared

parser = _shared.parser(
    __doc__, epochs=60, batch_size=64, learning_rate=1e-3, output="runs/image"
)
parser.add_argument(
    "--dataset",
    default="digits",
    choices=["digits", "mnist", "cifar10", "cifar100"],
    help="digits ships with scikit-learn; the others download",
)
parser.add_argument(
    "--preset", default="small", choices=["small", "deit-tiny"], help="ViT"
)
parser.add_argument(
    "--patch-size",
    type=_shared.positive_int,
    default=None,
    help="patch side in pixels (default: the preset's)",
)
parser.add_argument(
    "--beta",
    type=float,
    default=None,
    help="BN's recentering weight (default: the preset's, 1.0)",
)
parser.add_argument(
    "--mixed-precision", action="store_true", help="mixed_bfloat16 policy"
)
args = _shared.parse_args(parser)

# Keras after the options: `--help` and option errors need no backend.
keras = _shared.import_keras()
import numpy as np  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402

if args.mixed_precision:
    keras.config.set_dtype_policy("mixed_bfloat16")
# Each attention name and option checked before any data or training.
preset = ksa.VIT_PRESETS[args.preset]
overrides = {
    "patch_size": args.patch_size,
    "beta": args.beta,
    "head_factors": args.head_factors,
}
overrides = {k: v for k, v in overrides.items() if v is not None}
attentions = _shared.check_attentions(
    args.attention,
    preset["num_heads"],
    preset["width"] // preset["num_heads"],
    beta=args.beta,
    head_factors=args.head_factors,
)

"""
## Data

Images in [0, 1], `(height, width, channels)`: scikit-learn's 8x8 digits
(1437 train, 360 test), or MNIST / CIFAR through `keras.datasets`
(`_shared.load_images`).
"""

(x_train, y_train), (x_test, y_test), classes = _shared.load_images(
    args.dataset
)
if args.smoke:  # 128 random images of each split
    (x_train, y_train), (x_test, y_test) = _shared.smoke_subset(
        128, (x_train, y_train), (x_test, y_test)
    )
print(
    f"{args.dataset}: {len(x_train)} train, {len(x_test)} test, "
    f"images {x_train.shape[1:]}, {classes} classes"
)

"""
## Model

`vit_classifier`: patches, a CLS token (kept out of SH's pooling), learned
positions, pre-LN encoder blocks with the chosen attention, a dense head.
The preset gives the sizes; `--patch-size`, `--beta` and `--head-factors`
override them. Each attention is built once first, so that a bad option (a
patch size that does not divide the image, head factors of the wrong
length) stops the script with one line before any training.
"""


def build_model(attention):
    return ksa.vit_classifier(
        x_train.shape[1:],
        classes,
        attention=attention,
        preset=args.preset,
        **overrides,
    )


try:
    build_model(attentions[0])
except ValueError as e:
    _shared.fail(str(e).splitlines()[0])

"""
## Training: every attention, every seed

AdamW (weight decay 0.05) with cosine decay. The test set is
`validation_data`, so `val_accuracy` is the test accuracy after each epoch:
recorded for the curves, never used to choose. After training, the
attention maps of 64 test images give the head diversity (mean distance
between the heads' maps) and, for seed 0, a plot.
"""

os.makedirs(args.output, exist_ok=True)
runs = []
jobs = [(a, s) for a in attentions for s in range(args.seeds)]
for index, (attention, seed) in enumerate(jobs, 1):
    print(f"[{index}/{len(jobs)}] {attention} seed {seed}", flush=True)
    keras.utils.set_random_seed(seed)
    model = build_model(attention)
    steps = args.epochs * -(-len(x_train) // args.batch_size)
    model.compile(
        optimizer=_shared.adamw(args.learning_rate, steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[
            "accuracy",
            keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5"),
        ],
    )
    fit_options, timer = _shared.progress(args.epochs)
    start = time.perf_counter()
    history = model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_data=(x_test, y_test),
        **fit_options,
    )
    train_seconds = time.perf_counter() - start
    model.save(
        os.path.join(args.output, f"{_shared.slug(attention)}_seed{seed}.keras")
    )
    diversity = _shared.attention_diagnostics(
        model,
        x_test[:64],
        attention,
        seed,
        args.output,
        sample_name=f"test image 0 (class {y_test[0]}); token 0 is CLS",
    )
    runs.append(
        _shared.record(
            attention,
            seed,
            history.history,
            top5=100 * history.history["val_top5"][-1],
            params=model.count_params(),
            train_seconds=train_seconds,
            epoch_seconds=float(np.median(timer.seconds)),
            head_diversity=diversity,
        )
    )

_shared.write_results(args.output, args.dataset, args, runs)
