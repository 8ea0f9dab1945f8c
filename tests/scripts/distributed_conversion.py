"""Converted models on two virtual CPU devices give one device's outputs.

Run by tests/convert/test_distributed.py in a fresh JAX process with
XLA_FLAGS=--xla_force_host_platform_device_count=2. Prints one line per
check: "<name> <max abs difference>".
"""

import keras
import numpy as np

import keras_svr_attention as ksa


def build_model():
    inputs = keras.Input((12, 16))
    x = inputs
    for i in range(2):
        attention = keras.layers.MultiHeadAttention(
            num_heads=4, key_dim=4, name=f"attention_{i}"
        )
        x = keras.layers.LayerNormalization()(x + attention(x, x))
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def layout_map(mesh):
    """KerasHub's style: attention heads sharded over the "model" axis."""
    layout = keras.distribution.LayoutMap(mesh)
    layout[r".*(query|key|value).*kernel"] = (None, "model", None)
    layout[r".*(query|key|value).*bias"] = ("model", None)
    layout[r".*attention_output.*kernel"] = ("model", None, None)
    return layout


def main():
    assert len(keras.distribution.list_devices()) == 2, "needs 2 devices"
    x = np.random.default_rng(0).normal(size=(4, 12, 16)).astype("float32")
    keras.utils.set_random_seed(0)
    single = build_model()
    weights = single.get_weights()
    expected = {
        name: keras.ops.convert_to_numpy(
            ksa.replace_attention(
                single,
                name,
                **ksa.options_used_by(name, head_factors=[1, 1, 2, 4]),
            )(x)
        )
        for name in ("bn", "bn+sh")
    }

    mesh = keras.distribution.DeviceMesh((1, 2), ("batch", "model"))
    parallel = keras.distribution.ModelParallel(
        layout_map=layout_map(mesh), batch_dim_name="batch"
    )
    with parallel.scope():
        sharded = build_model()
        sharded.set_weights(weights)
        for name in ("bn", "bn+sh"):
            converted = ksa.replace_attention(
                sharded,
                name,
                **ksa.options_used_by(name, head_factors=[1, 1, 2, 4]),
            )
            kernel = converted.get_layer("attention_0").query_dense.kernel
            spec = str(kernel.value.sharding.spec)
            got = keras.ops.convert_to_numpy(converted(x))
            print(f"model_parallel/{name} {np.abs(got - expected[name]).max()}")
            print(f"sharding/{name} {spec.replace(' ', '')}")

    data = keras.distribution.DataParallel()
    with data.scope():
        replicated = build_model()
        replicated.set_weights(weights)
        converted = ksa.replace_attention(
            replicated, "bn+sh", head_factors=[1, 1, 2, 4]
        )
        got = keras.ops.convert_to_numpy(converted.predict(x, verbose=0))
        print(f"data_parallel/bn+sh {np.abs(got - expected['bn+sh']).max()}")


if __name__ == "__main__":
    main()
