"""Attention-Conv1D / Conv2D against the NumPy reference."""

import itertools

import keras
import numpy as np
import pytest

import keras_svr_attention as ksa
from tests import numpy_reference as ref
from tests.testing import MODES
from tests.testing import D
from tests.testing import N
from tests.testing import assert_allclose
from tests.testing import attention_weights
from tests.testing import make_inputs
from tests.testing import random_weights


def _run(layer, mode, query, causal, kernel="softmax", grid=None):
    layer(query, query)
    random_weights(layer)  # random kernels too: not the identity
    out = layer(query, query, use_causal_mask=causal)
    want, _ = ref.svr_attention(
        query.astype("float64"),
        query.astype("float64"),
        attention_weights(layer),
        causal_mask=causal,
        beta=MODES[mode].get("beta", 0.0),
        standardize=MODES[mode].get("standardize", False),
        head_factors=MODES[mode].get("head_factors"),
        num_prefix_tokens=1,
        kernel=kernel,
        conv_q=np.asarray(layer.query_conv.numpy(), "float64"),
        conv_k=np.asarray(layer.key_conv.numpy(), "float64"),
        conv_grid=grid,
    )
    return out, want


CASES = list(
    itertools.product(
        ["softmax", "bn", "sh", "bn+sh"], ["softmax", "linear"], [False, True]
    )
)


@pytest.mark.parametrize(
    "mode,kernel,causal",
    CASES,
    ids=[f"conv1d-{m}-{k}-{'causal' if c else 'full'}" for m, k, c in CASES],
)
def test_conv1d_attention_matches_numpy_reference(mode, kernel, causal):
    query, _, _ = make_inputs(self_attention=True)
    layer = ksa.SVRAttention(
        num_heads=N,
        key_dim=D,
        conv_kernel_size=3,
        num_prefix_tokens=1,
        kernel=kernel,
        **MODES[mode],
    )
    out, want = _run(layer, mode, query, causal, kernel)
    assert_allclose(out, want)


@pytest.mark.parametrize("mode", ["softmax", "bn"])
def test_conv2d_attention_matches_numpy_reference(mode):
    rng = np.random.default_rng(0)
    query = rng.normal(size=(2, 1 + 3 * 4, 6)).astype("float32")
    layer = ksa.SVRAttention(
        num_heads=N,
        key_dim=D,
        conv_kernel_size=3,
        conv_grid=(3, 4),
        num_prefix_tokens=1,
        **MODES[mode],
    )
    out, want = _run(layer, mode, query, False, grid=(3, 4))
    assert_allclose(out, want)


def test_conv_attention_starts_as_identity():
    query, _, _ = make_inputs(self_attention=True)
    plain = ksa.SVRAttention(num_heads=N, key_dim=D)
    conv = ksa.SVRAttention(num_heads=N, key_dim=D, conv_kernel_size=5)
    plain(query, query)
    conv(query, query)
    conv.set_weights(conv.get_weights()[:2] + plain.get_weights())
    want = plain(query, query, use_causal_mask=True)
    assert_allclose(conv(query, query, use_causal_mask=True), want)
    # The kernels are used: a shifted delta changes the output.
    conv.key_conv.assign(np.roll(conv.key_conv.numpy(), 1))
    got = conv(query, query, use_causal_mask=True)
    diff = keras.ops.convert_to_numpy(got) - keras.ops.convert_to_numpy(want)
    assert np.abs(diff).max() > 1e-3


def test_conv_attention_rejects_bad_options():
    with pytest.raises(ValueError, match="`conv_kernel_size`"):
        ksa.SVRAttention(2, 3, conv_kernel_size=0)
    with pytest.raises(ValueError, match="`conv_grid`"):
        ksa.SVRAttention(2, 3, conv_grid=(3, 4))
    with pytest.raises(ValueError, match="`conv_grid`"):
        ksa.SVRAttention(
            2, 3, conv_kernel_size=3, conv_grid=(3, 4), head_factors=[1, 2]
        )
    layer = ksa.SVRAttention(2, 3, conv_kernel_size=3, conv_grid=(3, 4))
    x = np.zeros((1, 12, 4), "float32")
    with pytest.raises(ValueError, match="`use_causal_mask`"):
        layer(x, x, use_causal_mask=True)
    with pytest.raises(ValueError, match="`conv_grid`"):
        layer(np.zeros((1, 11, 4), "float32"), np.zeros((1, 11, 4)))
