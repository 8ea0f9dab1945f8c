"""Compares softmax, BN, SH and BN+SH attention in a ViT image classifier.

Trains `vit_classifier` for each attention and seed, then prints the table
(top-1 and top-5 accuracy mean ± std, parameters, training time, images per
second, head redundancy) and writes results.{md,json,csv}, training curves,
attention maps and a head-redundancy plot to `--output`.

Default, offline: scikit-learn's 8x8 digits with the `small` preset.
`--dataset cifar10|cifar100|mnist` loads through `keras.datasets` (needs
internet); `--preset deit-tiny` is the paper's model, for a GPU.
The headline is the final epoch's top-1 test accuracy; the best epoch on
the test set is reported beside it, labelled as the paper's protocol.
Augmentation, DeiT's recipe: `--augment keras` uses Keras's own layers,
RandAugment and RandomErasing inside the model (training only) and MixUp or
CutMix on each training batch (one of the two at random, as DeiT switches
them), with one-hot labels and label smoothing 0.1; `--augment keras-cv`
the same through keras-cv (`pip install -e ".[keras-cv]"`; it needs
TensorFlow installed). Cost on a CPU (`benchmarks/augmentation.py`): close
to nothing on TensorFlow, about 5x an epoch on torch and 17x on JAX, where
RandAugment computes every candidate operation at each step; use a GPU, or
TensorFlow, for augmented runs on JAX's CPU.
Accelerators: a GPU is used when present; `--mixed-precision`;
`--data-parallel` shards batches over every local device
(`keras.distribution.DataParallel` on JAX, `tf.distribute.MirroredStrategy`
on TensorFlow); `--host-devices N` splits the CPU into N devices, to try
data parallelism on a machine without accelerators.

    pip install -e ".[jax,examples]"
    KERAS_BACKEND=jax python examples/image_classification.py
    KERAS_BACKEND=jax python examples/image_classification.py --smoke
"""

import argparse
import contextlib
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reporting  # noqa: E402

DATASETS = ["digits", "mnist", "cifar10", "cifar100"]
PRESETS = ["small", "deit-tiny"]

parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=reporting.HelpFormatter
)
parser.add_argument(
    "--dataset",
    default="digits",
    choices=DATASETS,
    help="digits ships with scikit-learn; the others download",
)
parser.add_argument(
    "--preset", default="small", choices=PRESETS, help="ViT size"
)
parser.add_argument(
    "--patch-size",
    type=reporting.positive_int,
    default=None,
    help="patch side in pixels (default: the preset's)",
)
reporting.add_training_arguments(
    parser, epochs=60, batch_size=64, learning_rate=1e-3, output="runs/image"
)
parser.add_argument(
    "--beta",
    type=float,
    default=None,
    help="BN's recentering weight (default: the preset's, 1.0)",
)
parser.add_argument(
    "--augment",
    default="none",
    choices=["none", "keras", "keras-cv"],
    help="DeiT's augmentation, through Keras's layers or keras-cv",
)
parser.add_argument(
    "--mixed-precision", action="store_true", help="mixed_bfloat16 policy"
)
parser.add_argument(
    "--data-parallel",
    action="store_true",
    help="shard batches over every local device (jax, tensorflow)",
)
parser.add_argument(
    "--host-devices",
    type=reporting.positive_int,
    default=None,
    help="split the CPU into N devices (jax, tensorflow)",
)
args = parser.parse_args()
if args.smoke:
    args.epochs, args.seeds = 1, 1

# Keras after the options: `--help` and option errors need no backend.
keras = reporting.import_keras()
import numpy as np  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402
from keras_svr_attention.diagnostics import plots  # noqa: E402


def image_augmentation(kind, image_shape):
    """DeiT-style per-image augmentation layers, or [] for "none".

    They act inside the model, during training only: "keras" gives
    RandAugment and RandomErasing, "keras-cv" RandAugment (RGB images only:
    its colour operations need three channels) and RandomCutout.
    """
    if kind == "none":
        return []
    if kind == "keras":
        return [
            keras.layers.RandAugment(value_range=(0, 1), num_ops=2, factor=0.5),
            keras.layers.RandomErasing(
                factor=0.25, scale=(0.02, 0.2), value_range=(0, 1)
            ),
        ]
    keras_cv = _import_keras_cv()
    layers = [keras_cv.layers.RandomCutout(0.25, 0.25)]
    if image_shape[-1] == 3:  # its colour operations need RGB
        layers.insert(
            0,
            keras_cv.layers.RandAugment(
                value_range=(0, 1), augmentations_per_image=2, magnitude=0.5
            ),
        )
    return layers


def batch_mixers(kind):
    """DeiT's MixUp (alpha 0.8) and CutMix (alpha 1.0), or [] for "none".

    They mix labels as well as images, so they act on training batches
    (see `MixedBatches`), not inside the model. Keras's CutMix weighs the
    labels by the continuous area of its box but pastes whole pixels: on
    8x8 digits the two may differ by a pixel row and column.
    """
    if kind == "none":
        return []
    if kind == "keras":
        return [keras.layers.MixUp(alpha=0.8), keras.layers.CutMix(factor=1.0)]
    keras_cv = _import_keras_cv()
    import tensorflow as tf

    def on_tf_tensors(layer):  # keras-cv checks TensorFlow dtypes
        return lambda batch: layer(
            {k: tf.convert_to_tensor(v) for k, v in batch.items()}
        )

    return [
        on_tf_tensors(keras_cv.layers.MixUp(alpha=0.8)),
        on_tf_tensors(keras_cv.layers.CutMix()),
    ]


def _import_keras_cv():
    try:
        import keras_cv
    except ImportError as e:
        reporting.fail(
            f"--augment keras-cv needs keras-cv and TensorFlow ({e}): "
            "pip install -e '.[keras-cv]'"
        )
    return keras_cv


class MixedBatches(keras.utils.PyDataset):
    """Shuffled training batches, each mixed by MixUp or CutMix.

    As DeiT does, every batch goes through one of `mixers` chosen at random
    with equal probability; `y` is one-hot and mixes with the images. The
    order is reshuffled after each epoch. Works on every backend: the
    mixers run eagerly and the batches are handed to `fit` as NumPy.
    """

    def __init__(self, x, y, batch_size, mixers, seed, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = x, y
        self.batch_size = batch_size
        self.mixers = mixers
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(len(x))

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        rows = self.order[
            index * self.batch_size : (index + 1) * self.batch_size
        ]
        mixer = self.mixers[self.rng.integers(len(self.mixers))]
        mixed = mixer({"images": self.x[rows], "labels": self.y[rows]})
        return (
            keras.ops.convert_to_numpy(mixed["images"]),
            keras.ops.convert_to_numpy(mixed["labels"]),
        )

    def on_epoch_end(self):
        self.order = self.rng.permutation(len(self.x))


def with_augmentation(model, layers):
    """Prepends training-only augmentation layers to `model`.

    The wrapper keeps the classifier as `.classifier` for the diagnostics
    (augmentation is the identity at inference).
    """
    if not layers:
        return model
    inputs = keras.Input(model.input_shape[1:])
    x = inputs
    for layer in layers:
        x = layer(x)
    wrapper = keras.Model(inputs, model(x), name=model.name)
    wrapper.classifier = model
    return wrapper


def local_devices():
    """The devices data parallelism would use: accelerators, else CPUs."""
    backend = keras.config.backend()
    if backend == "jax":
        return keras.distribution.list_devices()
    if backend == "tensorflow":
        import tensorflow as tf

        devices = tf.config.list_logical_devices("GPU")
        devices = devices or tf.config.list_logical_devices("CPU")
        return [d.name for d in devices]
    return [backend]


def split_host(count):
    """Splits the CPU into `count` devices, before the backend starts."""
    backend = keras.config.backend()
    if backend == "jax":
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={count}"
        )
    elif backend == "tensorflow":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count
        )
    else:
        reporting.fail("--host-devices needs the jax or tensorflow backend")


def distribution_scope(enabled):
    """Data parallelism over every local device, per backend.

    Returns a function giving the context to build and compile models in.
    """
    if not enabled:
        return contextlib.nullcontext
    backend = keras.config.backend()
    if backend == "jax":
        devices = local_devices()
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=devices)
        )
        print(f"data parallel over {len(devices)} devices")
        return contextlib.nullcontext
    if backend == "tensorflow":
        import tensorflow as tf

        strategy = tf.distribute.MirroredStrategy(local_devices())
        print(f"data parallel over {strategy.num_replicas_in_sync} devices")
        return strategy.scope
    reporting.fail("--data-parallel needs the jax or tensorflow backend")


"""
## Data

Images in [0, 1], `(height, width, channels)`. scikit-learn's 8x8 digits
ship with it; MNIST and CIFAR come through `keras.datasets`, which
downloads them once.
"""


def load_dataset(name):
    """(x_train, y_train), (x_test, y_test), num_classes."""
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x = (digits.images / 16.0).astype("float32")[..., None]
        x_train, x_test, y_train, y_test = train_test_split(
            x,
            digits.target,
            test_size=0.2,
            random_state=0,
            stratify=digits.target,
        )
        return (x_train, y_train), (x_test, y_test), 10
    try:
        (x_train, y_train), (x_test, y_test) = getattr(
            keras.datasets, name
        ).load_data()
    except Exception as e:  # no network: URLError, OSError, ...
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        reporting.fail(
            f"--dataset {name} is downloaded by keras.datasets and the "
            f"download failed (offline?): {reason[:120]}. --dataset digits "
            "works offline"
        )
    if x_train.ndim == 3:
        x_train, x_test = x_train[..., None], x_test[..., None]
    return (
        (x_train.astype("float32") / 255.0, y_train.reshape(-1)),
        (x_test.astype("float32") / 255.0, y_test.reshape(-1)),
        100 if name == "cifar100" else 10,
    )


if args.host_devices:
    split_host(args.host_devices)  # before the backend makes its devices
if args.mixed_precision:
    keras.config.set_dtype_policy("mixed_bfloat16")
preset = ksa.VIT_PRESETS[args.preset]
overrides = {
    k: v
    for k, v in {
        "patch_size": args.patch_size,
        "beta": args.beta,
        "head_factors": args.head_factors,
    }.items()
    if v is not None
}
attentions = reporting.check_attentions(
    args.attention,
    preset["num_heads"],
    preset["width"] // preset["num_heads"],
    beta=args.beta,
    head_factors=args.head_factors,
)
(x_train, y_train), (x_test, y_test), classes = load_dataset(args.dataset)
if args.smoke:  # 128 random images of each split
    pick = np.random.default_rng(0).permutation
    rows, test_rows = pick(len(y_train))[:128], pick(len(y_test))[:128]
    x_train, y_train = x_train[rows], y_train[rows]
    x_test, y_test = x_test[test_rows], y_test[test_rows]
print(
    f"{args.dataset}: {len(x_train)} train, {len(x_test)} test, "
    f"images {x_train.shape[1:]}, {classes} classes, "
    f"devices {local_devices()}"
)

"""
## Model

`vit_classifier`: patches, a CLS token (kept out of SH's pooling), learned
positions, pre-LN encoder blocks with the chosen attention, a dense head;
the augmentation layers, when any, go in front and act in training only.
"""


def build_model(attention):
    model = ksa.vit_classifier(
        x_train.shape[1:],
        classes,
        attention=attention,
        preset=args.preset,
        **overrides,
    )
    return with_augmentation(
        model, image_augmentation(args.augment, x_train.shape[1:])
    )


try:  # a patch size that does not divide the image, for one
    build_model(attentions[0])
except ValueError as e:
    reporting.fail(str(e).splitlines()[0])

"""
## Training: every attention, every seed

AdamW with cosine decay; with MixUp/CutMix the labels are one-hot
(`keras.utils.to_categorical`) and the loss uses DeiT's label smoothing.
The test set is `validation_data`, so `val_accuracy` is the test accuracy
after each epoch: recorded, never used to choose.
"""

scope = distribution_scope(args.data_parallel)
mixers = batch_mixers(args.augment)
if mixers:
    y_train = keras.utils.to_categorical(y_train, classes)
    y_test = keras.utils.to_categorical(y_test, classes)
    loss = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=0.1
    )
    top5 = keras.metrics.TopKCategoricalAccuracy
else:
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    top5 = keras.metrics.SparseTopKCategoricalAccuracy

os.makedirs(args.output, exist_ok=True)
results = reporting.Results(args.dataset, args)
runs = [(a, s) for a in attentions for s in range(args.seeds)]
for index, (attention, seed) in enumerate(runs, 1):
    print(f"[{index}/{len(runs)}] {attention} seed {seed}", flush=True)
    keras.utils.set_random_seed(seed)
    with scope():
        model = build_model(attention)
        steps = args.epochs * math.ceil(len(x_train) / args.batch_size)
        model.compile(
            optimizer=keras.optimizers.AdamW(
                keras.optimizers.schedules.CosineDecay(
                    args.learning_rate, steps
                ),
                weight_decay=0.05,
            ),
            loss=loss,
            metrics=["accuracy", top5(5, name="top5")],
        )
    if mixers:
        data = {
            "x": MixedBatches(x_train, y_train, args.batch_size, mixers, seed)
        }
    else:
        data = {"x": x_train, "y": y_train, "batch_size": args.batch_size}
    fit_options, timer = reporting.progress(args.epochs)
    start = time.perf_counter()
    history = model.fit(
        **data,
        epochs=args.epochs,
        validation_data=(x_test, y_test),
        **fit_options,
    )
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    model.predict(x_test, batch_size=256, verbose=0)
    images_per_second = len(x_test) / (time.perf_counter() - start)

    # Diagnostics on 64 test images: attention maps and head diversity.
    classifier = getattr(model, "classifier", model)
    maps = ksa.attention_maps(classifier, x_test[:64])
    results.add(
        attention,
        seed,
        history.history,
        top5=100 * history.history["val_top5"][-1],
        params=model.count_params(),
        train_seconds=train_seconds,
        epoch_seconds=float(np.median(timer.seconds)),
        test_images_per_second=images_per_second,
        head_diversity=ksa.head_redundancy(maps),
    )
    name = reporting.slug(attention)
    model.save(os.path.join(args.output, f"{name}_seed{seed}.keras"))
    if seed == 0:
        label = int(np.argmax(y_test[0])) if mixers else int(y_test[0])
        plots.plot_attention_maps(
            maps,
            sample_name=f"test image 0 (class {label}); token 0 is CLS",
            head_factors=classifier.get_layer(
                "block_0"
            ).attention_layer.head_factors,
            title=f"{attention} attention, seed 0",
            path=os.path.join(args.output, f"maps_{name}.png"),
        )

results.write(args.output)
