"""Softmax vs BN vs SH vs BN+SH attention on a UEA time-series task.

Trains the mvts_transformer-shaped `timeseries_classifier` once per
attention and seed, then prints the paper-style table and writes to
`--output`: results.md, results.json and results.csv (dataset,
hyperparameters, per-seed values, backend and versions), curves.png (test
accuracy per epoch, mean ± std over seeds), diversity.png (head diversity)
and maps_<attention>.png (one test series' attention maps), plus each
trained model as <attention>_seed<k>.keras.

The headline is the final epoch's test accuracy. Beside it, the best epoch
on the test set, which is the paper's protocol (mvts_transformer evaluates
on the test set after every epoch and the paper follows it), for
comparison with the paper's Table 1 only.

Default, offline: UEA JapaneseVowels from the copy inside aeon
(variable-length series: padded, with masks). `--dataset NAME` takes any
UEA/UCR name; aeon downloads those it does not ship.

    pip install -e ".[jax,examples]"
    KERAS_BACKEND=jax python examples/timeseries_classification.py
    KERAS_BACKEND=jax python examples/timeseries_classification.py --smoke
"""

import os
import time

import _shared

parser = _shared.parser(
    __doc__, epochs=100, batch_size=32, learning_rate=3e-3, output="runs/ts"
)
parser.add_argument(
    "--dataset",
    default="JapaneseVowels",
    help="UEA/UCR set; those inside aeon load offline, others download",
)
parser.add_argument(
    "--beta", type=float, default=0.6, help="BN's recentering weight"
)
parser.add_argument(
    "--width", type=_shared.positive_int, default=64, help="model width"
)
parser.add_argument(
    "--depth", type=_shared.positive_int, default=2, help="encoder blocks"
)
parser.add_argument(
    "--num-heads", type=_shared.positive_int, default=8, help="heads"
)
parser.add_argument(
    "--dropout", type=_shared.rate, default=0.2, help="dropout rate"
)
parser.add_argument(
    "--noise",
    type=float,
    default=0.2,
    help="std of the Gaussian noise added to the inputs in training",
)
args = _shared.parse_args(parser)
if args.width % args.num_heads:
    _shared.fail(
        f"--width {args.width} must be a multiple of --num-heads "
        f"{args.num_heads}"
    )

# Keras after the options: `--help` and option errors need no backend.
keras = _shared.import_keras()
import numpy as np  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402

attentions = _shared.check_attentions(
    args.attention,
    args.num_heads,
    args.width // args.num_heads,
    beta=args.beta,
    head_factors=args.head_factors,
)

"""
## Data

Each series is `(steps, channels)`; `load_uea` pads them to the longest
with `keras.utils.pad_sequences` and returns a mask of the real steps, which
every attention and the final pooling respect.
"""

try:
    train, test, classes = ksa.datasets.load_uea(args.dataset)
except ValueError as e:
    _shared.fail(str(e))
x_train, mask_train, y_train = train
x_test, mask_test, y_test = test
if args.smoke:  # 64 random series of each split
    (x_train, mask_train, y_train), (x_test, mask_test, y_test) = (
        _shared.smoke_subset(64, train, test)
    )
max_length, channels = x_train.shape[1:]
print(
    f"{args.dataset}: {len(y_train)} train, {len(y_test)} test series, "
    f"up to {max_length} steps, {channels} channels, {len(classes)} classes"
)

"""
## Model

Input projection, learned positions, pre-LN encoder blocks with the chosen
attention, mean over the real steps, dense head.
"""


def build_model(attention):
    return ksa.timeseries_classifier(
        max_length,
        channels,
        len(classes),
        attention=attention,
        width=args.width,
        depth=args.depth,
        num_heads=args.num_heads,
        mlp_dim=4 * args.width,
        head_factors=args.head_factors,
        beta=args.beta,
        dropout=args.dropout,
        input_noise=args.noise,
    )


"""
## Training: every attention, every seed

AdamW (weight decay 0.05) with cosine decay. The test set is passed as
`validation_data`, so Keras's `val_accuracy` is the test accuracy after
each epoch: it is only recorded (for the curves and the paper's protocol),
never used to choose. After training, the attention maps of 64 test series
give the head diversity and, for seed 0, a plot.
"""

os.makedirs(args.output, exist_ok=True)
runs = []
jobs = [(a, s) for a in attentions for s in range(args.seeds)]
for index, (attention, seed) in enumerate(jobs, 1):
    print(f"[{index}/{len(jobs)}] {attention} seed {seed}", flush=True)
    keras.utils.set_random_seed(seed)
    model = build_model(attention)
    steps = args.epochs * -(-len(y_train) // args.batch_size)
    model.compile(
        optimizer=_shared.adamw(args.learning_rate, steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    fit_options, timer = _shared.progress(args.epochs)
    start = time.perf_counter()
    history = model.fit(
        [x_train, mask_train],
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_data=([x_test, mask_test], y_test),
        **fit_options,
    )
    train_seconds = time.perf_counter() - start
    model.save(
        os.path.join(args.output, f"{_shared.slug(attention)}_seed{seed}.keras")
    )
    diversity = _shared.attention_diagnostics(
        model,
        [x_test[:64], mask_test[:64]],
        attention,
        seed,
        args.output,
        sample_name=f"test series 0 (class {classes[y_test[0]]})",
        padding_mask=mask_test[:64],
    )
    runs.append(
        _shared.record(
            attention,
            seed,
            history.history,
            params=model.count_params(),
            train_seconds=train_seconds,
            epoch_seconds=float(np.median(timer.seconds)),
            head_diversity=diversity,
        )
    )

_shared.write_results(args.output, args.dataset, args, runs)
