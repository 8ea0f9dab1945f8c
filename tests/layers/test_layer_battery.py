"""The battery every layer goes through (the KerasHub pattern): config round
trip, symbolic and eager calls, one fit step, jit, mixed precision, and a
`.keras` save/load equality."""

import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests.testing import BACKEND
from tests.testing import assert_allclose
from tests.testing import covering_off_torch
from tests.testing import random_weights
from tests.testing import slow_on_jax

T, F = 9, 8
LAYERS = {
    "softmax": lambda: ksa.SVRAttention(num_heads=4, key_dim=3),
    "bn": lambda: ksa.AttentionBN(num_heads=4, key_dim=3, learn_beta=True),
    "bn-std": lambda: ksa.SVRAttention(
        num_heads=4, key_dim=3, beta=0.5, standardize=True
    ),
    "sh": lambda: ksa.AttentionSH(num_heads=4, key_dim=3),
    "bn+sh": lambda: ksa.AttentionBNSH(
        num_heads=4, key_dim=3, num_prefix_tokens=1, dropout=0.1
    ),
    "linear+bn+sh": lambda: ksa.LinearAttention(
        num_heads=4, key_dim=3, beta=1.0, head_factors=[1, 2, 1, 3]
    ),
    "conv1d+bn": lambda: ksa.SVRAttention(
        num_heads=4, key_dim=3, beta=1.0, conv_kernel_size=3
    ),
    "conv2d": lambda: ksa.SVRAttention(
        num_heads=4, key_dim=3, conv_kernel_size=3, conv_grid=(3, 3)
    ),
    "sparse+bn": lambda: ksa.SparseAttention(
        num_heads=4, key_dim=3, beta=0.5, sparsity="fixed", block_size=3
    ),
    "gqa+bn+sh": lambda: ksa.SVRGroupedQueryAttention(
        head_dim=3,
        num_query_heads=4,
        num_key_value_heads=2,
        beta=1.0,
        learn_beta=True,
        head_factors=[1, 2],
        num_prefix_tokens=1,
        dropout=0.1,
    ),
    "gqa+linear+bn": lambda: ksa.SVRGroupedQueryAttention(
        head_dim=3,
        num_query_heads=4,
        num_key_value_heads=2,
        beta=0.5,
        head_factors=[3, 1],
        kernel="linear",
    ),
}

# Fit, jit, mixed precision, long sequences: every layer class on every
# backend; SVRAttention's standardized and conv configurations on torch
# (covering, suite, tests/testing.py: the model battery and the layer
# tests reach their code on TensorFlow and JAX).
MODEL_LEVEL = covering_off_torch(
    LAYERS, [n for n in LAYERS if n not in ("bn-std", "conv1d+bn", "conv2d")]
)


def _model(layer, causal=False):
    inputs = keras.Input((T, F))
    mask = keras.Input((T,), dtype="bool")
    x = layer(inputs, inputs, value_mask=mask, use_causal_mask=causal)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model([inputs, mask], keras.layers.Dense(2)(x))


def _data(n=6):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, T, F)).astype("float32")
    mask = np.arange(T)[None] < rng.integers(3, T + 1, size=(n, 1))
    return [x, mask], rng.normal(size=(n, 2)).astype("float32")


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_config_round_trip(name):
    layer = LAYERS[name]()
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert type(restored) is type(layer)
    assert restored.get_config() == config


@pytest.mark.parametrize("name", MODEL_LEVEL)
def test_layer_fit_and_save_load(name, tmp_path):
    model = _model(LAYERS[name](), causal=name == "sh")
    model.compile("sgd", "mse")  # the optimizer is not under test
    x, y = _data()
    before = [np.copy(w) for w in model.get_weights()]
    history = model.fit(x, y, epochs=1, batch_size=3, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = model.get_weights()
    assert any(
        not np.allclose(a, b) for a, b in zip(before, after, strict=True)
    )
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert_allclose(
        loaded.predict(x, verbose=0),
        model.predict(x, verbose=0),
        atol=1e-6,
        rtol=1e-6,
    )


@pytest.mark.parametrize("name", MODEL_LEVEL)
def test_layer_jit_compile(name):
    if BACKEND == "torch":
        pytest.skip("jit_compile means torch.compile on torch; eager below")
    if BACKEND == "jax":  # (tests/models/test_model_battery.py compares
        # JAX's jit-compiled predict with eager calls)
        pytest.skip("an uncompiled model's predict is jit-compiled on JAX")
    model = _model(LAYERS[name](), causal=name != "conv2d")
    x, _ = _data()
    eager = model.predict(x, verbose=0)
    model.compile(jit_compile=True)
    assert_allclose(model.predict(x, verbose=0), eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_torch_eager(name):
    if BACKEND != "torch":
        pytest.skip("torch only")
    layer = LAYERS[name]()
    (x, mask), _ = _data()
    out = layer(x, x, value_mask=mask, use_causal_mask=name != "conv2d")
    assert out.shape == (6, T, F)
    assert np.isfinite(ops.convert_to_numpy(out)).all()


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", MODEL_LEVEL)
def test_layer_mixed_precision(name, policy):
    """Outputs and scores under a mixed policy against the float32 layer with
    the same weights, at a relative RMS error of 1e-2 (float16: 11
    significant bits) or 5e-2 (bfloat16: 8), through four projections and
    the kernel in low precision."""
    (x, mask), _ = _data()
    mask[0] = False  # a sample that sees nothing: zeros, not NaN
    full = LAYERS[name]()
    full(x, x)
    random_weights(full)
    keras.config.set_dtype_policy(policy)
    layer = LAYERS[name]()
    layer(x, x)
    layer.set_weights(full.get_weights())
    tolerance = 1e-2 if policy == "mixed_float16" else 5e-2
    kwargs = dict(
        value_mask=mask,
        use_causal_mask=name != "conv2d",
        return_attention_scores=True,
    )
    pairs = zip(layer(x, x, **kwargs), full(x, x, **kwargs), strict=True)
    for got, want in pairs:
        assert keras.backend.standardize_dtype(got.dtype) == (
            layer.compute_dtype
        )
        got = ops.convert_to_numpy(ops.cast(got, "float32")).astype("float64")
        want = ops.convert_to_numpy(want).astype("float64")
        assert np.isfinite(got).all()
        error = np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))
        assert error < tolerance, error
        if got.ndim == 4:  # the scores of the sample that sees nothing
            np.testing.assert_array_equal(got[0], 0.0)
    for w in layer.weights:
        assert keras.backend.standardize_dtype(w.dtype) == "float32"


@slow_on_jax
@pytest.mark.parametrize("name", MODEL_LEVEL)
def test_layer_long_sequence_is_finite(name):
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = LAYERS[name]()
    if name == "conv2d":
        pytest.skip("the grid fixes the length")
    x = np.random.default_rng(0).normal(size=(1, 2048, F)) * 10
    out = layer(x, x, use_causal_mask=True)
    assert np.isfinite(ops.convert_to_numpy(ops.cast(out, "float32"))).all()
