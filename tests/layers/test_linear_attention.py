"""Linear attention (Phi = elu + 1) with BN and SH against NumPy."""

import itertools

import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from keras_svr_attention.functional import kernels
from keras_svr_attention.functional.visibility import CausalPrefix
from tests.testing import MODES
from tests.testing import B
from tests.testing import D
from tests.testing import N
from tests.testing import S
from tests.testing import T
from tests.testing import assert_allclose
from tests.testing import make_inputs
from tests.testing import make_masks
from tests.testing import random_weights
from tests.testing import reference

CASES = list(
    itertools.product(
        MODES, ["none", "padding", "causal", "padding+causal"], [0, 2]
    )
)


@pytest.mark.parametrize(
    "mode,mask_kind,prefix",
    CASES,
    ids=[f"linear-{m}-{k}-prefix{p}" for m, k, p in CASES],
)
def test_linear_attention_matches_numpy_reference(mode, mask_kind, prefix):
    query, value, key = make_inputs()
    _, value_mask, causal = make_masks(mask_kind, T, S)
    layer = ksa.SVRAttention(
        num_heads=N,
        key_dim=D,
        num_prefix_tokens=prefix,
        kernel="linear",
        **MODES[mode],
    )
    layer(query, value, key)
    random_weights(layer)
    kwargs = dict(value_mask=value_mask, use_causal_mask=causal)
    out, scores = layer(
        query, value, key, return_attention_scores=True, **kwargs
    )
    fast = layer(query, value, key, **kwargs)
    want_out, want_scores = reference(
        layer,
        mode,
        query,
        value,
        key,
        None,
        value_mask,
        causal,
        kernel="linear",
        num_prefix_tokens=prefix,
    )
    tol = 5e-5 if MODES[mode].get("standardize") else 1e-5
    assert_allclose(scores, want_scores, tol, tol, err_msg="scores")
    assert_allclose(out, want_out, tol, tol, err_msg="output")
    assert_allclose(fast, want_out, tol, tol, err_msg="output, no scores")


@pytest.mark.parametrize("causal", [None, "gathered", "aligned"])
def test_linear_kernel_equals_dense_formula(causal):
    rng = np.random.default_rng(0)
    q, k, v = (
        rng.normal(size=(2, 6, 3, 4)).astype("float32") for _ in range(3)
    )
    lengths = np.arange(1, 7, dtype="int32")[None]
    causal = (
        CausalPrefix(lengths, aligned=causal == "aligned") if causal else None
    )
    out, _ = kernels.linear_attention(q, k, v, causal=causal)
    phi = np.where(q > 0, q + 1, np.exp(q)), np.where(k > 0, k + 1, np.exp(k))
    sim = np.einsum("btnd,bsnd->bnts", *phi)
    if causal:
        sim = sim * np.tril(np.ones((6, 6)))
    sim = sim / sim.sum(-1, keepdims=True)
    assert_allclose(out, np.einsum("bnts,bsnd->btnd", sim, v))


def test_linear_attention_refuses_arbitrary_masks():
    layer = ksa.SVRAttention(num_heads=N, key_dim=D, kernel="linear")
    query, value, key = make_inputs()
    with pytest.raises(ValueError, match="`attention_mask`.*linear"):
        layer(query, value, key, attention_mask=np.ones((B, T, S), bool))
    # A padding mask through attention_mask is fine and equals value_mask.
    pad = np.arange(S)[None] < np.array([[S], [4]])
    a = layer(query, value, key, attention_mask=pad[:, None, :])
    b = layer(query, value, key, value_mask=pad)
    assert_allclose(a, b)


def test_linear_attention_rejects_dropout_and_unknown_kernel():
    with pytest.raises(ValueError, match="`dropout`"):
        ksa.SVRAttention(num_heads=2, key_dim=3, kernel="linear", dropout=0.1)
    with pytest.raises(ValueError, match="`kernel`"):
        ksa.SVRAttention(num_heads=2, key_dim=3, kernel="cosine")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_linear_attention_mixed_precision_is_finite(policy):
    import keras

    keras.config.set_dtype_policy(policy)
    layer = ksa.SVRAttention(
        num_heads=4,
        key_dim=3,
        kernel="linear",
        beta=1.0,
        head_factors=[1, 1, 2, 4],
    )
    x = np.random.default_rng(0).normal(size=(2, 300, 8)) * 5
    out = layer(x, x, use_causal_mask=True)
    assert keras.backend.standardize_dtype(out.dtype) == layer.compute_dtype
    assert np.isfinite(ops.convert_to_numpy(ops.cast(out, "float32"))).all()
