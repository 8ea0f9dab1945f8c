"""Compares softmax, BN, SH and BN+SH attention in a ViT image classifier.

Trains `vit_classifier` for each attention and seed, then prints the table
(top-1 and top-5 accuracy mean ± std, parameters, training time, images per
second, head redundancy) and writes results.{md,json,csv}, training curves,
attention maps and a head-redundancy plot to `--output`.

Default, offline: scikit-learn's 8x8 digits with the `small` preset.
`--dataset cifar10|cifar100|mnist` loads through `keras.datasets` (needs
internet); `--preset deit-tiny` is the paper's model, for a GPU.
Augmentation (the image part of DeiT's recipe): `--augment keras` uses
Keras's own RandAugment and RandomErasing layers; `--augment keras-cv` the
same through keras-cv (`pip install -e ".[keras-cv]"`; it needs TensorFlow
installed). MixUp/CutMix are not applied (integer labels).
Accelerators: a GPU is used when present; `--mixed-precision`;
`--data-parallel` shards batches over every local device
(`keras.distribution.DataParallel` on JAX, `tf.distribute.MirroredStrategy`
on TensorFlow).

    pip install -e ".[examples,jax]"
    KERAS_BACKEND=jax python examples/image_classification.py
"""

import argparse
import contextlib
import os
import sys

import keras

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


def augmentation(kind, num_classes, image_shape):
    """DeiT-style image augmentation as a list of layers, or [] for none.

    "keras": RandAugment and RandomErasing; "keras-cv": RandAugment (RGB
    images only: its colour operations need three channels) and
    RandomCutout. MixUp and CutMix are not applied: they mix labels, and
    this example trains on integer labels.
    """
    if kind == "none":
        return []
    if kind == "keras":
        layers = keras.layers
        return [
            layers.RandAugment(value_range=(0, 1), num_ops=2, factor=0.5),
            layers.RandomErasing(
                factor=0.25, scale=(0.02, 0.2), value_range=(0, 1)
            ),
        ]
    if kind == "keras-cv":
        try:
            import keras_cv
        except ImportError as e:
            raise SystemExit(
                "error: --augment keras-cv needs keras-cv and TensorFlow: "
                "pip install keras-cv tensorflow"
            ) from e
        layers = [keras_cv.layers.RandomCutout(0.25, 0.25)]
        if image_shape[-1] == 3:  # its colour operations need RGB
            layers.insert(
                0,
                keras_cv.layers.RandAugment(
                    value_range=(0, 1),
                    augmentations_per_image=2,
                    magnitude=0.5,
                ),
            )
        return layers
    raise SystemExit(f"error: unknown --augment {kind!r}")


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
    """The devices Keras sees (keras.distribution lists them on JAX only)."""
    if keras.config.backend() != "jax":
        return [keras.config.backend()]
    return keras.distribution.list_devices()


def distribution_scope(enabled):
    """Data parallelism over every local device, per backend."""
    if not enabled:
        return contextlib.nullcontext()
    backend = keras.config.backend()
    if backend == "jax":
        devices = local_devices()
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=devices)
        )
        print(f"data parallel over {len(devices)} devices")
        return contextlib.nullcontext()
    if backend == "tensorflow":
        import tensorflow as tf

        strategy = tf.distribute.MirroredStrategy()
        print(f"data parallel over {strategy.num_replicas_in_sync} devices")
        return strategy.scope()
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
    args = p.parse_args(argv)
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

    def build(name):
        with scope:
            model = ksa.vit_classifier(
                x_train.shape[1:],
                classes,
                attention=name,
                preset=args.preset,
                **overrides,
            )
            return with_augmentation(
                model, augmentation(args.augment, classes, x_train.shape[1:])
            )

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
        extra_metrics=[
            keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5")
        ],
        verbose=2 if args.smoke else 1,
    )


if __name__ == "__main__":
    main()
