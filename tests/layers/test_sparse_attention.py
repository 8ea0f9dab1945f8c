"""Sparse attention (Child et al. patterns) with BN and SH against NumPy."""

import itertools

import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from keras_svr_attention.functional import masks
from tests.testing import MODES
from tests.testing import B
from tests.testing import D
from tests.testing import N
from tests.testing import T
from tests.testing import assert_allclose
from tests.testing import make_inputs
from tests.testing import random_weights
from tests.testing import reference


def numpy_pattern(sparsity, t, s, size):
    """The patterns written from Child et al. (2019), loops over (i, j)."""
    out = np.zeros((t, s), bool)
    for i in range(t):
        for j in range(s):
            if sparsity == "local":
                out[i, j] = abs(i - j) < size
            elif sparsity == "strided":
                out[i, j] = abs(i - j) < size or (i - j) % size == 0
            elif sparsity == "fixed":
                out[i, j] = i // size == j // size or j % size >= size - 1
    return out


@pytest.mark.parametrize("sparsity", masks.SPARSITY)
def test_sparse_masks_match_numpy_patterns(sparsity):
    got = ops.convert_to_numpy(masks.sparse_mask(sparsity, 9, 11, 3))
    np.testing.assert_array_equal(got[0], numpy_pattern(sparsity, 9, 11, 3))


CASES = list(itertools.product(MODES, masks.SPARSITY, [False, True]))


@pytest.mark.parametrize(
    "mode,sparsity,causal",
    CASES,
    ids=[f"sparse-{m}-{s}-{'causal' if c else 'full'}" for m, s, c in CASES],
)
def test_sparse_attention_matches_numpy_reference(mode, sparsity, causal):
    query, value, _ = make_inputs(self_attention=True)
    layer = ksa.SVRAttention(
        num_heads=N,
        key_dim=D,
        sparsity=sparsity,
        block_size=3,
        num_prefix_tokens=1,
        **MODES[mode],
    )
    layer(query, value)
    random_weights(layer)
    out, scores = layer(
        query, value, use_causal_mask=causal, return_attention_scores=True
    )
    pattern = np.broadcast_to(numpy_pattern(sparsity, T, T, 3), (B, T, T))
    want_out, want_scores = reference(
        layer,
        mode,
        query,
        value,
        None,
        pattern,
        None,
        causal,
        num_prefix_tokens=1,
    )
    tol = 5e-5 if MODES[mode].get("standardize") else 1e-5
    assert_allclose(scores, want_scores, tol, tol)
    assert_allclose(out, want_out, tol, tol)


def test_sparse_attention_preset_and_bad_options():
    layer = ksa.SparseAttention(num_heads=2, key_dim=3)
    assert layer.get_config()["sparsity"] == "strided"
    with pytest.raises(ValueError, match="`sparsity`"):
        ksa.SVRAttention(2, 3, sparsity="dilated", block_size=2)
    with pytest.raises(ValueError, match="`block_size`"):
        ksa.SVRAttention(2, 3, sparsity="fixed", block_size=0)
    with pytest.raises(ValueError, match="`block_size`"):
        ksa.SVRAttention(2, 3, block_size=4)
    with pytest.raises(ValueError, match="`sparsity`.*linear"):
        ksa.SVRAttention(2, 3, sparsity="local", block_size=2, kernel="linear")


@pytest.mark.parametrize(
    "name", ["linear", "linear+bn+sh", "sparse+bn", "sparse+bn+sh"]
)
def test_family_names_build_and_run(name):
    layer = ksa.get(name, 4, 3)
    x = np.random.default_rng(0).normal(size=(2, 10, 6)).astype("float32")
    out = layer(x, x, use_causal_mask=True)
    assert out.shape == (2, 10, 6)
    assert np.isfinite(ops.convert_to_numpy(out)).all()
