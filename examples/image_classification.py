"""Compares softmax, BN, SH and BN+SH attention in a ViT image classifier.

Trains `vit_classifier` for each attention and seed, then prints the table
(top-1 and top-5 accuracy mean ± std, parameters, training time, images per
second, head redundancy) and writes results.{md,json,csv}, training curves,
attention maps and a head-redundancy plot to `--output`.

Default, offline: scikit-learn's 8x8 digits with the `small` preset.
`--dataset cifar10|cifar100|mnist` loads through `keras.datasets` (needs
internet); `--preset deit-tiny` is the paper's model, for a GPU.
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

    pip install -e ".[examples,jax]"
    KERAS_BACKEND=jax python examples/image_classification.py
"""

import argparse
import contextlib
import os
import sys

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402

DATASETS = ["digits", "mnist", "cifar10", "cifar100"]


def load_dataset(name):
    """(x_train, y_train), (x_test, y_test), num_classes; images in [0, 1]."""
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
    if name not in DATASETS:
        raise SystemExit(
            f"error: unknown dataset {name!r}; choose from {DATASETS}"
        )
    module = getattr(keras.datasets, name)
    (x_train, y_train), (x_test, y_test) = module.load_data()
    x_train = x_train.astype("float32") / 255.0
    x_test = x_test.astype("float32") / 255.0
    if x_train.ndim == 3:
        x_train, x_test = x_train[..., None], x_test[..., None]
    classes = 100 if name == "cifar100" else 10
    return (
        (x_train, y_train.reshape(-1)),
        (x_test, y_test.reshape(-1)),
        classes,
    )


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
        raise SystemExit(
            "error: --augment keras-cv needs keras-cv and TensorFlow: "
            "pip install keras-cv tensorflow"
        ) from e
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
        raise SystemExit(
            "error: --host-devices needs the jax or tensorflow backend"
        )


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
    raise SystemExit(
        "error: --data-parallel needs the jax or tensorflow backend"
    )


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--dataset", default="digits", help=", ".join(DATASETS))
    p.add_argument("--preset", default="small", choices=sorted(ksa.VIT_PRESETS))
    p.add_argument("--patch-size", type=int, default=None)
    common.add_training_arguments(
        p,
        epochs=60,
        batch_size=64,
        learning_rate=1e-3,
        beta=None,
        output="runs/image",
    )
    p.add_argument(
        "--augment", default="none", choices=["none", "keras", "keras-cv"]
    )
    p.add_argument("--mixed-precision", action="store_true")
    p.add_argument("--data-parallel", action="store_true")
    p.add_argument(
        "--host-devices",
        type=int,
        default=None,
        help="split the CPU into N devices (jax, tensorflow)",
    )
    args = p.parse_args(argv)
    if args.host_devices:
        split_host(args.host_devices)
    attentions = common.parse_attentions(args.attention)
    if args.mixed_precision:
        keras.config.set_dtype_policy("mixed_bfloat16")
    (x_train, y_train), (x_test, y_test), classes = load_dataset(args.dataset)
    if args.smoke:
        args.epochs, args.seeds = 1, 1
        x_train, y_train = x_train[:128], y_train[:128]
        x_test, y_test = x_test[:128], y_test[:128]
    overrides = {}
    if args.patch_size:
        overrides["patch_size"] = args.patch_size
    if args.beta is not None:
        overrides["beta"] = args.beta
    if args.head_factors:
        overrides["head_factors"] = common.parse_factors(args.head_factors)
    scope = distribution_scope(args.data_parallel)
    mixers = batch_mixers(args.augment)

    def build(name):
        model = ksa.vit_classifier(
            x_train.shape[1:],
            classes,
            attention=name,
            preset=args.preset,
            **overrides,
        )
        return with_augmentation(
            model, image_augmentation(args.augment, x_train.shape[1:])
        )

    if mixers:  # mixed labels: one-hot targets, DeiT's label smoothing
        y_train = np.eye(classes, dtype="float32")[y_train]
        y_test = np.eye(classes, dtype="float32")[y_test]
        loss = keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=0.1
        )
        top5 = keras.metrics.TopKCategoricalAccuracy(5, name="top5")

        def train_data(seed):
            return MixedBatches(x_train, y_train, args.batch_size, mixers, seed)

    else:
        loss, train_data = None, None
        top5 = keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5")
    print(
        f"{args.dataset}: {len(x_train)} train, {len(x_test)} test, "
        f"images {x_train.shape[1:]}, {classes} classes, "
        f"devices {local_devices()}"
    )
    return common.run_comparison(
        build,
        (x_train, y_train),
        (x_test, y_test),
        attentions,
        args.seeds,
        args.epochs,
        args.batch_size,
        args.learning_rate,
        args.output,
        redundancy_inputs=x_test[:64],
        extra_metrics=[top5],
        loss=loss,
        train_data=train_data,
        verbose=2 if args.smoke else 1,
        scope=scope,
    )


if __name__ == "__main__":
    main()
