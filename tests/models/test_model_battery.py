"""What users build: every mode in a functional model on an unknown length.

For each mode x {no mask, causal, padding through a Keras mask}: a model on
`keras.Input((None, F))`, predicted at two lengths (TensorFlow retraces with
a `None` length) and compared with the eager layer; `fit` with
`jit_compile=True`; `.keras` save and load; on TensorFlow, a SavedModel
export served at a third length. Plus the causal prefix property: outputs on
`x[:, :t]` equal the first t outputs on `x`, with and without right padding.
"""

import os

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import keras_svr_attention as ksa
from tests.testing import BACKEND
from tests.testing import assert_allclose
from tests.testing import compiles_the_train_step
from tests.testing import random_weights

F = 6
MODES = {
    "softmax": {},
    "bn": {"beta": 0.8},
    "sh": {"head_factors": [1, 2, 3, 2]},
    "bn+sh": {"beta": 1.0, "head_factors": [2, 1, 1, 4]},
    "linear": {"kernel": "linear"},
    "linear+bn+sh": {"kernel": "linear", "beta": 1.0, "head_factors": [1, 2]},
    "sparse": {"sparsity": "strided", "block_size": 3},
    "conv": {"conv_kernel_size": 3, "beta": 0.5},
}
MASKS = ["none", "causal", "padding"]


def _layer(mode):
    options = dict(MODES[mode])
    heads = len(options.get("head_factors", [0] * 4))
    return ksa.SVRAttention(num_heads=heads, key_dim=3, **options)


def _model(mode, mask):
    inputs = keras.Input((None, F))
    x = inputs
    if mask == "padding":
        x = keras.layers.Masking(0.0)(x)  # right padding: zero rows
    layer = _layer(mode)
    x = layer(x, x, use_causal_mask=mask == "causal")
    return keras.Model(inputs, keras.layers.Dense(2)(x)), layer


def _inputs(length, seed=0, batch=2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, length, F)).astype("float32")
    x[1, length - 2 :] = 0.0  # row 1 right-padded by 2 (masked in "padding")
    return x


def _eager(model, layer, x, mask):
    """The same computation without the model: the layer called eagerly."""
    kwargs = {"use_causal_mask": mask == "causal"}
    if mask == "padding":
        valid = np.any(x != 0.0, axis=-1)
        kwargs.update(query_mask=valid, value_mask=valid)
    return model.layers[-1](layer(x, x, **kwargs))


def _padded_rows_zeroed(got, x, mask):
    """Padded query rows are free (MHA too leaves them arbitrary): compare
    valid rows only."""
    if mask != "padding":
        return got
    got = np.array(keras.ops.convert_to_numpy(got))
    got[~np.any(x != 0.0, axis=-1)] = 0.0
    return got


@compiles_the_train_step
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("mode", list(MODES))
def test_model_on_unknown_length_predicts_fits_saves_and_exports(
    mode, mask, tmp_path
):
    model, layer = _model(mode, mask)
    random_weights(model, seed=1)
    # Two lengths: TensorFlow's predict retraces with a None length.
    for length in (5, 9):
        x = _inputs(length)
        got = model.predict(x, verbose=0)
        want = _eager(model, layer, x, mask)
        assert_allclose(
            _padded_rows_zeroed(got, x, mask),
            _padded_rows_zeroed(want, x, mask),
            atol=1e-4,
            rtol=1e-4,
            err_msg=f"predict at T={length}",
        )
    model.compile("adam", "mse", jit_compile=True)
    history = model.fit(x, np.ones((2, 9, 2), "float32"), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])

    # The trained model against its reload, both without the optimizer (a
    # jit-compiled predict would compile each once more and check nothing
    # of ours); at T=9, whose eager ops JAX has compiled above.
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    assert_allclose(
        _padded_rows_zeroed(loaded.predict(x, verbose=0), x, mask),
        _padded_rows_zeroed(_eager(model, layer, x, mask), x, mask),
        1e-5,
        1e-5,
    )

    if BACKEND == "tensorflow":
        import tensorflow as tf

        export = os.path.join(tmp_path, "served")
        model.export(export, format="tf_saved_model", verbose=False)
        served = tf.saved_model.load(export)
        x = _inputs(11, seed=2)  # a third length
        assert_allclose(
            served.serve(tf.constant(x)),
            model.predict(x, verbose=0),
            1e-4,
            1e-4,
        )


# Eager JAX compiles every op for every new length: fewer examples there;
# `nox -s slow` draws SVR_FUZZ_EXAMPLES on every backend.
PREFIX_EXAMPLES = int(
    os.environ.get("SVR_FUZZ_EXAMPLES", 2 if BACKEND == "jax" else 5)
)


@settings(
    max_examples=PREFIX_EXAMPLES, deadline=None, derandomize=True, database=None
)
@given(
    mode=st.sampled_from(list(MODES)),
    prefix=st.integers(0, 2),
    padding=st.integers(0, 4),
)
def test_causal_outputs_depend_only_on_earlier_positions(mode, prefix, padding):
    # Output t on x[:, :t+1] equals output t on x, for every t, and right
    # padding after x changes none of them.
    options = dict(MODES[mode])
    heads = len(options.get("head_factors", [0] * 4))
    layer = ksa.SVRAttention(
        num_heads=heads, key_dim=3, num_prefix_tokens=prefix, **options
    )
    length = 8
    x = _inputs(length, seed=3)[:1]
    full = keras.ops.convert_to_numpy(layer(x, x, use_causal_mask=True))
    for t in range(max(prefix, 1), length + 1):
        cut = layer(x[:, :t], x[:, :t], use_causal_mask=True)
        assert_allclose(cut, full[:, :t], 1e-5, 1e-5, err_msg=f"t={t}")
    if padding:
        padded = np.concatenate([x, np.full((1, padding, F), 5.0)], 1)
        padded = padded.astype("float32")
        valid = np.arange(length + padding)[None] < length
        got = layer(
            padded,
            padded,
            use_causal_mask=True,
            query_mask=valid,
            value_mask=valid,
        )
        assert_allclose(got[:, :length], full, 1e-5, 1e-5)
