"""DeiT's augmentation recipe around a ViT with SVR attention.

The image example (`image_classification.py`) trained on clean images.
This one trains the same `vit_classifier` with the augmentation DeiT uses,
the recipe the paper's ImageNet models follow:

- RandAugment and RandomErasing inside the model, so they act in training
  only;
- MixUp or CutMix on each training batch, one of the two at random, with
  one-hot labels and label smoothing 0.1.

`--augment keras` (default) uses Keras's own layers on every backend;
`--augment keras-cv` the same through keras-cv (`pip install -e
".[keras-cv]"`; it needs TensorFlow). What it costs an epoch on a CPU is
measured by `benchmarks/augmentation.py`: close to nothing on TensorFlow,
several times an epoch on torch and JAX, where RandAugment computes every
candidate operation at each step. Use TensorFlow or a GPU for long runs.
Writes the same results files and plots as the image example.

    KERAS_BACKEND=tensorflow python examples/image_augmentation.py --seeds 1
    KERAS_BACKEND=torch python examples/image_augmentation.py --smoke
"""

import time

import _shared

parser = _shared.parser(
    __doc__, epochs=60, batch_size=64, learning_rate=1e-3, output="runs/augment"
)
parser.add_argument(
    "--augment",
    default="keras",
    choices=["keras", "keras-cv"],
    help="Keras's augmentation layers, or keras-cv's",
)
args = _shared.parse_args(parser)

keras = _shared.import_keras()
import numpy as np  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402

if args.augment == "keras-cv":
    try:
        import keras_cv
        import tensorflow as tf
    except ImportError as e:
        _shared.fail(
            f"--augment keras-cv needs keras-cv and TensorFlow ({e}): "
            "pip install -e '.[keras-cv]'"
        )
preset = ksa.VIT_PRESETS["small"]
attentions = _shared.check_attentions(
    args.attention,
    preset["num_heads"],
    preset["width"] // preset["num_heads"],
    head_factors=args.head_factors,
)

"""
## Data

scikit-learn's 8x8 digits, offline. MixUp and CutMix mix the labels too,
so the labels are one-hot (`keras.utils.to_categorical`).
"""

(x_train, y_train), (x_test, y_test), classes = _shared.load_images("digits")
if args.smoke:
    (x_train, y_train), (x_test, y_test) = _shared.smoke_subset(
        128, (x_train, y_train), (x_test, y_test)
    )
labels_test = y_test
y_train = keras.utils.to_categorical(y_train, classes)
y_test = keras.utils.to_categorical(y_test, classes)

"""
## Per-image augmentation, inside the model

Keras's `RandAugment` picks two of its operations per image;
`RandomErasing` blanks a random box. keras-cv's counterparts are its
`RandAugment` (RGB only: its colour operations need three channels, so it
is left out on the grey digits) and `RandomCutout`. Both kinds are the
identity at inference.
"""


def image_augmentation():
    if args.augment == "keras":
        return [
            keras.layers.RandAugment(value_range=(0, 1), num_ops=2, factor=0.5),
            keras.layers.RandomErasing(
                factor=0.25, scale=(0.02, 0.2), value_range=(0, 1)
            ),
        ]
    layers = [keras_cv.layers.RandomCutout(0.25, 0.25)]
    if x_train.shape[-1] == 3:
        layers.insert(
            0,
            keras_cv.layers.RandAugment(
                value_range=(0, 1), augmentations_per_image=2, magnitude=0.5
            ),
        )
    return layers


def build_model(attention):
    """The classifier behind the augmentation layers. The wrapper keeps it
    as `.classifier`, for the attention maps of the trained model."""
    classifier = ksa.vit_classifier(
        x_train.shape[1:],
        classes,
        attention=attention,
        preset="small",
        **({"head_factors": args.head_factors} if args.head_factors else {}),
    )
    inputs = keras.Input(x_train.shape[1:])
    x = inputs
    for layer in image_augmentation():
        x = layer(x)
    model = keras.Model(inputs, classifier(x), name=classifier.name)
    model.classifier = classifier
    return model


"""
## MixUp and CutMix, on each batch

They mix labels as well as images, so they act on the training batches,
not inside the model. As DeiT does, every batch goes through MixUp
(alpha 0.8) or CutMix (alpha 1.0), chosen at random. A
`keras.utils.PyDataset` hands `fit` the mixed batches as NumPy, so this
works on every backend; the order is reshuffled after each epoch. (Keras's
CutMix weighs the labels by the continuous area of its box but pastes
whole pixels: on 8x8 digits the two may differ by a pixel row.)
"""


def batch_mixers():
    if args.augment == "keras":
        return [keras.layers.MixUp(alpha=0.8), keras.layers.CutMix(factor=1.0)]

    def on_tf_tensors(layer):  # keras-cv checks TensorFlow dtypes
        return lambda batch: layer(
            {k: tf.convert_to_tensor(v) for k, v in batch.items()}
        )

    return [
        on_tf_tensors(keras_cv.layers.MixUp(alpha=0.8)),
        on_tf_tensors(keras_cv.layers.CutMix()),
    ]


class MixedBatches(keras.utils.PyDataset):
    def __init__(self, seed, **kwargs):
        super().__init__(**kwargs)
        self.mixers = batch_mixers()
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(len(x_train))

    def __len__(self):
        return -(-len(x_train) // args.batch_size)

    def __getitem__(self, index):
        rows = self.order[
            index * args.batch_size : (index + 1) * args.batch_size
        ]
        mixer = self.mixers[self.rng.integers(len(self.mixers))]
        mixed = mixer({"images": x_train[rows], "labels": y_train[rows]})
        return tuple(
            keras.ops.convert_to_numpy(mixed[k]) for k in ("images", "labels")
        )

    def on_epoch_end(self):
        self.order = self.rng.permutation(len(x_train))


"""
## Training: every attention, every seed

As in the image example, with DeiT's label smoothing 0.1 on the one-hot
labels.
"""

runs = []
jobs = [(a, s) for a in attentions for s in range(args.seeds)]
for index, (attention, seed) in enumerate(jobs, 1):
    print(f"[{index}/{len(jobs)}] {attention} seed {seed}", flush=True)
    keras.utils.set_random_seed(seed)
    model = build_model(attention)
    batches = MixedBatches(seed)
    model.compile(
        optimizer=_shared.adamw(args.learning_rate, args.epochs * len(batches)),
        loss=keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=0.1
        ),
        metrics=[
            "accuracy",
            keras.metrics.TopKCategoricalAccuracy(5, name="top5"),
        ],
    )
    fit_options, timer = _shared.progress(args.epochs)
    start = time.perf_counter()
    history = model.fit(
        batches,
        epochs=args.epochs,
        validation_data=(x_test, y_test),
        **fit_options,
    )
    train_seconds = time.perf_counter() - start
    diversity = _shared.attention_diagnostics(
        model.classifier,
        x_test[:64],
        attention,
        seed,
        args.output,
        sample_name=f"test image 0 (class {labels_test[0]}); token 0 is CLS",
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

_shared.write_results(
    args.output, f"digits, --augment {args.augment}", args, runs
)
