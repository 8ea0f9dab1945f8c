"""Structural guard of the fused kernel (issue 37): every head group of
every softmax mode reaches `keras.ops.dot_product_attention` (torch's
`scaled_dot_product_attention`, JAX's fused attention) wherever
MultiHeadAttention does, in the manner of Keras's own
`test_causal_only_fast_path`.

A spy on the backend's `dot_product_attention` records the heads of each
call. MultiHeadAttention makes one call of N heads; our layer makes one per
head group, of the group's size (Counter of the head factors: a group is
the heads sharing a factor, an independent count of what the plan does).
On TensorFlow, which has no fused kernel (its `dot_product_attention` is
the same einsum math), one-head groups take the explicit path by design
(XLA compiles that gradient faster: `kernels.fuses`); every group of
several heads still goes through the op.
"""

import collections

import keras
import numpy as np
import pytest
from keras.src import backend as keras_backend

import keras_svr_attention as ksa
from tests.testing import BACKEND
from tests.testing import MODES
from tests.testing import N
from tests.testing import S
from tests.testing import T
from tests.testing import make_inputs
from tests.testing import make_masks

# The LRA shape (factors 1, 2: two one-head groups) and the UEA-like ones.
CASES = {
    **MODES,
    "sh-lra": {"head_factors": [1, 2]},
    "bn+sh-lra": {"beta": 0.6, "head_factors": [1, 2]},
}
MASKS = ["none", "causal", "padding"]


@pytest.fixture
def fused_heads(monkeypatch):
    """The number of heads of each call of the backend's fused op."""
    calls = []
    original = keras_backend.nn.dot_product_attention

    def spy(query, *args, **kwargs):
        calls.append(query.shape[2])
        return original(query, *args, **kwargs)

    monkeypatch.setattr(keras_backend.nn, "dot_product_attention", spy)
    return calls


def _call(layer, mask_kind):
    query, value, key = make_inputs()
    _, value_mask, causal = make_masks(mask_kind, T, S)
    return layer(
        query, value, key, value_mask=value_mask, use_causal_mask=causal
    )


def _expected_groups(factors):
    sizes = sorted(collections.Counter(factors).values())
    if BACKEND == "tensorflow":
        return [size for size in sizes if size > 1]
    return sizes


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("mode", list(CASES))
def test_every_head_group_takes_the_fused_kernel(mode, mask, fused_heads):
    options = CASES[mode]
    factors = options.get("head_factors", [1] * N)
    heads = len(factors)
    mha = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=3)
    _call(mha, mask)
    assert fused_heads == [heads], "the control: MHA fuses all its heads"
    fused_heads.clear()
    layer = ksa.SVRAttention(num_heads=heads, key_dim=3, **options)
    _call(layer, mask)
    assert sorted(fused_heads) == _expected_groups(factors)


@pytest.mark.parametrize("mode", ["softmax", "bn+sh", "sh-lra"])
def test_grouped_query_groups_take_the_fused_kernel(mode, fused_heads):
    """SVRGroupedQueryAttention against Keras's GroupedQueryAttention: each
    key/value head group's query heads in one fused call."""
    options = dict(CASES[mode])
    kv_factors = options.pop("head_factors", [1, 1])[::-1]
    kv_heads = len(kv_factors)
    sizes = dict(head_dim=3, num_query_heads=2 * kv_heads)
    sizes["num_key_value_heads"] = kv_heads
    query, value, key = make_inputs()
    keras.layers.GroupQueryAttention(**sizes)(query, value, key)
    assert fused_heads == [2 * kv_heads], "the control fuses all its heads"
    fused_heads.clear()
    layer = ksa.SVRGroupedQueryAttention(
        **sizes, head_factors=kv_factors, **options
    )
    layer(query, value, key, use_causal_mask=True)
    groups = collections.Counter(kv_factors).values()
    expected = sorted(2 * size for size in groups)
    assert sorted(fused_heads) == expected


def test_one_head_group_with_a_scale_keeps_the_logits():
    """A one-head fused call carries a non-default scale in the query
    (`_exporters.fused_scale`): the same numbers as the explicit path."""
    from keras_svr_attention.functional import kernels

    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 5, 1, 4)).astype("float32") for _ in "qkv")
    fused, _ = kernels.softmax_attention(q, k, v, scale=0.3, is_causal=True)
    logits = np.einsum("btd,bsd->bts", q[:, :, 0], k[:, :, 0]) * 0.3
    logits = np.where(np.tril(np.ones((5, 5), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    want = np.einsum("bts,bsd->btd", weights, v[:, :, 0])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(fused)[:, :, 0], want, atol=1e-5
    )


@pytest.mark.parametrize("kernel", ["softmax", "linear"])
def test_a_decoding_step_writes_its_slots_without_a_scan(monkeypatch, kernel):
    # One new token: no cumulative sum, no chunk of the linear recurrence
    # (the window's, Attention-BN's and the linear state's sums are the
    # state's plus the token), no zeros of a fresh state built to check
    # the options. A softmax state writes each group's slot of the keys
    # and of the values: two `slice_update`s per head group, in place
    # under XLA; on torch, whose `slice_update` at a tensor index clones
    # and scatters through index grids, a `where` on the slot instead.
    calls = collections.Counter()
    for name in ("slice_update", "cumsum", "tril", "zeros"):
        module = next(
            m
            for m in (keras_backend.core, keras_backend.numpy)
            if hasattr(m, name)
        )
        original = getattr(module, name)

        def spy(*args, _name=name, _original=original, **kw):
            calls[_name] += 1
            return _original(*args, **kw)

        monkeypatch.setattr(module, name, spy)
    factors = [1, 1, 2, 4]
    layer = ksa.SVRAttention(
        num_heads=4, key_dim=3, beta=1.0, head_factors=factors, kernel=kernel
    )
    x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    state = layer.get_initial_state(2, max_length=8)
    _, state = layer(x, x, cache=state, use_causal_mask=True)
    assert calls["cumsum"] > 0  # the spies see a prefill's sums
    calls.clear()
    layer(x[:, :1], x[:, :1], cache=state, use_causal_mask=True)
    writes = 2 * len(set(factors))
    if kernel == "linear" or BACKEND == "torch":
        writes = 0
    assert calls["slice_update"] == writes
    assert calls["cumsum"] == calls["tril"] == calls["zeros"] == 0
