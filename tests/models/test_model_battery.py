"""What users build: each mode of `MODEL_MODES` (one per branch of the
forward) in a functional model on an unknown length (on TensorFlow and
JAX, `COVERING_MODES` by default, the others in `nox -s slow`).

For each mode, a model on `keras.Input((None, F))` with one attention per
mask kind (no mask, causal, padding through a Keras mask), predicted at two
lengths (TensorFlow retraces with a `None` length) and compared with the
eager layers; on TensorFlow, a SavedModel export served at a third length;
`fit` with `jit_compile=True`; `.keras` save and load. Plus the causal
prefix property: outputs on `x[:, :t]` equal the first t outputs on `x`,
with and without right padding.
"""

import os

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tests.testing import BACKEND
from tests.testing import COVERING_MODES
from tests.testing import MODEL_MODES
from tests.testing import assert_allclose
from tests.testing import compiles_the_train_step
from tests.testing import covering_off_torch
from tests.testing import model_layer
from tests.testing import random_weights

F = 6
MODES = list(MODEL_MODES)
MASKS = ["none", "causal", "padding"]


def _model(mode):
    """One model per mode, one attention per mask kind: a branch each, so
    that one jit-compiled train step, one save and one export cover the
    three cases. The branches' outputs are concatenated (one output, whose
    loss tracker exists before the first step: a tf.function that creates
    variables traces twice)."""
    inputs = keras.Input((None, F))
    masked = keras.layers.Masking(0.0)(inputs)  # right padding: zero rows
    branches, outputs = {}, []
    for mask in MASKS:
        layer = model_layer(mode)
        x = masked if mask == "padding" else inputs
        head = keras.layers.Dense(2, name=f"{mask}_output")
        outputs.append(head(layer(x, x, use_causal_mask=mask == "causal")))
        branches[mask] = (layer, head)
    outputs = keras.layers.Concatenate()(outputs)
    return keras.Model(inputs, outputs), branches


def _inputs(length, seed=0, batch=2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, length, F)).astype("float32")
    x[1, length - 2 :] = 0.0  # row 1 right-padded by 2 (masked in "padding")
    return x


def _eager(branches, x):
    """The same computation without the model: each branch's layer called
    eagerly, padding given as explicit masks."""
    outputs = []
    for mask, (layer, head) in branches.items():
        kwargs = {"use_causal_mask": mask == "causal"}
        if mask == "padding":
            valid = np.any(x != 0.0, axis=-1)
            kwargs.update(query_mask=valid, value_mask=valid)
        outputs.append(head(layer(x, x, **kwargs)))
    return keras.ops.concatenate(outputs, axis=-1)


def _assert_branches_close(got, want, x, tolerance, what):
    """Branch by branch (the concatenated outputs split in equal parts).
    Padded query rows are free (MHA too leaves them arbitrary): the padding
    branch is compared on valid rows only."""
    padded = ~np.any(x != 0.0, axis=-1)
    got, want = (
        np.split(np.array(keras.ops.convert_to_numpy(t)), len(MASKS), axis=-1)
        for t in (got, want)
    )
    for mask, g, w in zip(MASKS, got, want, strict=True):
        if mask == "padding":
            g[padded] = w[padded] = 0.0
        assert_allclose(
            g, w, tolerance, tolerance, err_msg=f"{what}, mask={mask}"
        )


@compiles_the_train_step
@pytest.mark.parametrize(
    "mode",
    covering_off_torch(MODES, COVERING_MODES),
)
def test_model_on_unknown_length_predicts_fits_saves_and_exports(
    mode, tmp_path
):
    model, branches = _model(mode)
    random_weights(model, seed=1)
    # Two lengths: TensorFlow's predict retraces with a None length.
    for length in (5, 9):
        x = _inputs(length)
        got = model.predict(x, verbose=0)
        _assert_branches_close(
            got, _eager(branches, x), x, 1e-4, f"predict at T={length}"
        )

    if BACKEND == "tensorflow":
        import tensorflow as tf

        # Before `compile`, which would make predict trace anew.
        export = os.path.join(tmp_path, "served")
        model.export(export, format="tf_saved_model", verbose=False)
        served = tf.saved_model.load(export)
        x11 = _inputs(11, seed=2)  # a third length
        _assert_branches_close(
            served.serve(tf.constant(x11)),
            model.predict(x11, verbose=0),
            x11,
            1e-4,
            "SavedModel at T=11",
        )

    # SGD: the optimizer is not under test, and Adam's update is a quarter
    # of a small model's first fit (the trace of its train step).
    model.compile("sgd", "mse", jit_compile=True)
    targets = np.ones((2, 9, 2 * len(MASKS)), "float32")
    history = model.fit(x, targets, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])

    # The trained model against its reload, both without the optimizer (a
    # jit-compiled predict would compile each once more and check nothing
    # of ours); at T=9, whose eager ops JAX has compiled above.
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    _assert_branches_close(
        loaded.predict(x, verbose=0), _eager(branches, x), x, 1e-5, "reload"
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
    mode=st.sampled_from(MODES),
    prefix=st.integers(0, 2),
    padding=st.integers(0, 4),
)
def test_causal_outputs_depend_only_on_earlier_positions(mode, prefix, padding):
    # Output t on x[:, :t+1] equals output t on x, for every t, and right
    # padding after x changes none of them.
    layer = model_layer(mode, num_prefix_tokens=prefix)
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
