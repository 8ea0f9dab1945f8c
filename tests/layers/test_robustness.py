"""Finite outputs and gradients over masks x dtypes x lengths x scales.

The fuzz findings of issue 9 as tests, then a seeded property-based test
(hypothesis) over the whole space: every output and gradient is finite and
every query row that sees no key outputs exactly zero.
"""

import os

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

import keras_svr_attention as ksa
from tests import numpy_reference as ref
from tests.testing import MODES
from tests.testing import N
from tests.testing import assert_allclose
from tests.testing import make_inputs
from tests.testing import random_weights
from tests.testing import reference
from tests.testing import slow_on_jax
from tests.testing import svr_layer
from tests.testing import value_and_grad

FEATURES = 8


def _finite(x):
    return bool(
        np.all(np.isfinite(ops.convert_to_numpy(ops.cast(x, "float32"))))
    )


def _loss_and_grad(layer, x, dtype="float32", **call_kwargs):
    """d/dx of sum(layer(x, x) * w), w fixed, with x cast to `dtype`."""
    weights = np.random.default_rng(9).normal(size=x.shape[:2] + (FEATURES,))
    weights = weights.astype("float32")

    def loss(inputs):
        inputs = ops.cast(inputs, dtype)
        out = layer(inputs, inputs, **call_kwargs)
        return ops.sum(
            ops.cast(out, "float32") * ops.convert_to_tensor(weights)
        )

    return value_and_grad(loss, x)


@slow_on_jax
@pytest.mark.parametrize("mode", ["softmax", "bn", "bn-std", "sh", "bn+sh"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_linear_gradients_stay_finite_for_large_inputs(mode, causal):
    # exp on the branch `where` does not take overflowed at x * 100, and
    # its zero-weighted gradient was 0 * inf = NaN.
    x = np.random.default_rng(0).normal(size=(2, 9, FEATURES)) * 100
    layer = ksa.SVRAttention(
        num_heads=N, key_dim=3, kernel="linear", **MODES[mode]
    )
    layer(x.astype("float32"), x.astype("float32"))
    random_weights(layer)
    value, grad = _loss_and_grad(
        layer, x.astype("float32"), use_causal_mask=causal
    )
    assert _finite(value) and _finite(grad)


@pytest.mark.parametrize("mode", ["sh", "bn+sh", "bn-std+sh"])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_prefix_as_long_as_the_sequence(mode, kernel, causal):
    # Nothing left to pool: every head sees the unpooled keys. Crashed under
    # the linear kernel and under a causal mask.
    query, value, _ = make_inputs(num_queries=5, self_attention=True)
    layer = ksa.SVRAttention(
        num_heads=N,
        key_dim=3,
        kernel=kernel,
        num_prefix_tokens=5,
        **MODES[mode],
    )
    layer(query, value)
    random_weights(layer)
    got = layer(query, value, use_causal_mask=causal)
    want, _ = reference(
        layer,
        mode,
        query,
        value,
        None,
        None,
        None,
        causal,
        kernel=kernel,
        num_prefix_tokens=5,
    )
    tol = 5e-5 if MODES[mode].get("standardize") else 1e-5
    assert_allclose(got, want, tol, tol)


MASK_KINDS = [
    "none",
    "causal",
    "fully_masked_row",
    "no_key_at_all",
    "single_valid_token",
    "padded_queries",
    "prefix_is_length",
]


def _masks(kind, kernel, length, rng):
    """(call kwargs, num_prefix_tokens, (B, T, S) numpy mask of what each
    query may see)."""
    batch = 2
    full = np.ones((batch, length, length), bool)
    kwargs, prefix = {}, 0
    if kind in ("causal", "padded_queries", "prefix_is_length"):
        kwargs["use_causal_mask"] = True
        full &= ref.causal(length, length)[None]
    if kind == "fully_masked_row":
        if kernel == "linear":
            query_mask = np.ones((batch, length), bool)
            query_mask[0, -1] = False
            kwargs["query_mask"] = query_mask
            full &= query_mask[:, :, None]
        else:
            mask = rng.random((batch, length, length)) < 0.7
            mask[0, -1] = False
            kwargs["attention_mask"] = mask
            full &= mask
    elif kind == "no_key_at_all":
        value_mask = np.ones((batch, length), bool)
        value_mask[1] = False
        kwargs["value_mask"] = value_mask
        full &= value_mask[:, None, :]
    elif kind == "single_valid_token":
        value_mask = np.zeros((batch, length), bool)
        value_mask[:, -1] = True
        kwargs["value_mask"] = value_mask
        full &= value_mask[:, None, :]
    elif kind == "padded_queries":
        query_mask = rng.random((batch, length)) < 0.5
        kwargs["query_mask"] = query_mask
        full &= query_mask[:, :, None]
    elif kind == "prefix_is_length":
        prefix = length
    return kwargs, prefix, full


# 40 examples take seconds on TensorFlow and torch. On JAX every example
# compiles new shapes (eager JAX compiles each op per shape): a minute, so
# there the test runs in `nox -s slow` only. That session sets
# SVR_FUZZ_EXAMPLES to draw many more on every backend.
EXAMPLES = int(os.environ.get("SVR_FUZZ_EXAMPLES", 40))


@slow_on_jax
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    kind=st.sampled_from(["svr", "gqa"]),
    mode=st.sampled_from(list(MODES)),
    kernel=st.sampled_from(["softmax", "linear"]),
    masks=st.sampled_from(MASK_KINDS),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    length=st.sampled_from([1, 4, 9]),
    scale=st.sampled_from([1e-4, 1.0, 100.0]),
)
def test_outputs_and_gradients_finite_and_blind_rows_zero(
    kind, mode, kernel, masks, dtype, length, scale
):
    """Both layers (`kind`: SVRAttention or grouped-query attention)."""
    rng = np.random.default_rng(length)
    x = (rng.normal(size=(2, length, FEATURES)) * scale).astype("float32")
    kwargs, prefix, full = _masks(masks, kernel, length, rng)
    layer = svr_layer(
        kind,
        MODES[mode],
        kernel=kernel,
        num_prefix_tokens=prefix,
        use_bias=False,  # a row that sees nothing then outputs exactly 0
        dtype=dtype,
    )
    out = layer(ops.cast(x, dtype), ops.cast(x, dtype), **kwargs)
    assert _finite(out), "non-finite output"
    blind = ~full.any(axis=-1)
    out = ops.convert_to_numpy(ops.cast(out, "float32"))
    np.testing.assert_array_equal(out[blind], 0.0)
    value, grad = _loss_and_grad(layer, x, dtype, **kwargs)
    assert _finite(value) and _finite(grad), "non-finite gradient"


@pytest.mark.skipif(
    keras.backend.standardize_dtype(ops.zeros((), "float64").dtype)
    != "float64",
    reason="JAX runs float64 only with jax_enable_x64",
)
def test_float64_layer_runs_in_float64():
    x = np.random.default_rng(0).normal(size=(2, 5, FEATURES))
    layer = ksa.AttentionBNSH(num_heads=N, key_dim=3, dtype="float64")
    out = layer(x, x, use_causal_mask=True)
    assert keras.backend.standardize_dtype(out.dtype) == "float64"
