"""Trains a ViT with Attention-BN+SH over every local device.

Data parallelism: each device holds a copy of the model and takes a shard
of every batch; the gradients are averaged. Keras does it on JAX with
`keras.distribution.DataParallel`; on TensorFlow, `tf.distribute`'s
`MirroredStrategy` does it, with the model built and compiled in its scope.
The layers need nothing special for it. Torch's multi-GPU training goes
through torch's own launcher, outside the scope of this example.

Without accelerators, `--host-devices N` splits the CPU into N devices, to
try it on any machine. Trains on scikit-learn's digits (offline) and
writes the image example's results files.

    KERAS_BACKEND=jax python examples/data_parallel.py --host-devices 2
    KERAS_BACKEND=tensorflow python examples/data_parallel.py --smoke
"""

import contextlib
import os
import time

import _shared

parser = _shared.parser(
    __doc__, epochs=20, batch_size=64, learning_rate=1e-3, output="runs/dp"
)
parser.set_defaults(attention="bn+sh", seeds=1)
parser.add_argument(
    "--host-devices",
    type=_shared.positive_int,
    default=None,
    help="split the CPU into N devices (default: the machine's devices)",
)
args = _shared.parse_args(parser)

keras = _shared.import_keras()
backend = keras.config.backend()
if backend not in ("jax", "tensorflow"):
    _shared.fail(
        f"data parallelism here needs jax or tensorflow, not {backend}"
    )
import numpy as np  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402

"""
## Devices

The CPU is split before the backend creates its devices: on JAX through
an XLA flag (read when JAX starts its CPU backend), on TensorFlow as
logical devices. Accelerators, when present, are used instead.
"""

if backend == "jax":
    if args.host_devices:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.host_devices}"
        )
    devices = keras.distribution.list_devices()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=devices)
    )
    scope = contextlib.nullcontext
else:
    import tensorflow as tf

    if args.host_devices:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.host_devices
        )
    devices = [
        d.name
        for d in tf.config.list_logical_devices("GPU")
        or tf.config.list_logical_devices("CPU")
    ]
    scope = tf.distribute.MirroredStrategy(devices).scope
print(f"data parallel over {len(devices)} devices: {devices}", flush=True)

"""
## Data and model

The image example's digits and `small` ViT. The global batch of
`--batch-size` images is split evenly over the devices.
"""

(x_train, y_train), (x_test, y_test), classes = _shared.load_images("digits")
if args.smoke:
    (x_train, y_train), (x_test, y_test) = _shared.smoke_subset(
        128, (x_train, y_train), (x_test, y_test)
    )
preset = ksa.VIT_PRESETS["small"]
attentions = _shared.check_attentions(
    args.attention,
    preset["num_heads"],
    preset["width"] // preset["num_heads"],
    head_factors=args.head_factors,
)

"""
## Training

Built and compiled inside the scope (TensorFlow places the variables
there); `fit` then shards each batch.
"""

runs = []
for attention in attentions:
    for seed in range(args.seeds):
        print(f"{attention} seed {seed}", flush=True)
        keras.utils.set_random_seed(seed)
        with scope():
            model = ksa.vit_classifier(
                x_train.shape[1:], classes, attention=attention, preset="small"
            )
            steps = args.epochs * -(-len(x_train) // args.batch_size)
            model.compile(
                optimizer=_shared.adamw(args.learning_rate, steps),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True
                ),
                metrics=["accuracy"],
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
        runs.append(
            _shared.record(
                attention,
                seed,
                history.history,
                devices=len(devices),
                params=model.count_params(),
                train_seconds=time.perf_counter() - start,
                epoch_seconds=float(np.median(timer.seconds)),
                head_diversity=_shared.attention_diagnostics(
                    model,
                    x_test[:64],
                    attention,
                    seed,
                    args.output,
                    sample_name=f"test image 0 (class {y_test[0]})",
                ),
            )
        )

_shared.write_results(
    args.output, f"digits over {len(devices)} devices", args, runs
)
