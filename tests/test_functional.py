"""Unit tests of the functional core against plain NumPy."""

import numpy as np
import pytest
from keras import ops

from keras_svr_attention.functional import masks
from keras_svr_attention.functional import pooling
from keras_svr_attention.functional import statistics
from keras_svr_attention.functional import visibility
from tests import numpy_reference as ref
from tests.testing import assert_allclose


def test_causal_mask_matches_lower_triangle():
    got = ops.convert_to_numpy(masks.causal_mask(4, 6))
    np.testing.assert_array_equal(got[0], ref.causal(4, 6))


@pytest.mark.parametrize("offset", [2, np.int32(3)])
def test_causal_mask_with_an_offset(offset):
    # Query t at position offset + t, as in cached decoding.
    got = ops.convert_to_numpy(masks.causal_mask(2, 6, offset))
    want = np.arange(6)[None] <= np.arange(2)[:, None] + int(offset)
    np.testing.assert_array_equal(got[0], want)


def test_merge_masks_is_none_tolerant_and():
    a = np.array([[[True, False, True]]])
    b = np.array([[[True], [False]]])
    assert masks.merge_masks(None, None) is None
    got = ops.convert_to_numpy(masks.merge_masks(a, None, b))
    np.testing.assert_array_equal(got, a & b)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", ["none", "padding", "dense", "per-head"])
def test_key_moments_match_masked_numpy_moments(kind, causal):
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(2, 7, 3, 4)).astype("float32") + 2.0
    T = 5
    if kind == "none":
        full = np.ones((2, 1, T, 7), bool)
    elif kind == "padding":
        full = (np.arange(7)[None] < np.array([[7], [4]]))[:, None, None, :]
    elif kind == "dense":
        full = (rng.random((2, T, 7)) < 0.6)[:, None]
    else:
        full = rng.random((2, 3, T, 7)) < 0.6
    if causal:
        full = full & ref.causal(T, 7)[None, None]
    mask = None if kind == "none" and not causal else full
    mean, var = statistics.key_moments(keys, mask, with_variance=True)
    mean = np.broadcast_to(ops.convert_to_numpy(mean), (2, T, 3, 4))
    var = np.broadcast_to(ops.convert_to_numpy(var), (2, T, 3, 4))
    full = np.broadcast_to(full, (2, 3, T, 7))
    for b in range(2):
        for n in range(3):
            for i in range(T):
                seen = keys[b, full[b, n, i], n].astype("float64")
                if len(seen) == 0:
                    np.testing.assert_array_equal(mean[b, i, n], 0)
                    continue
                assert_allclose(mean[b, i, n], seen.mean(0))
                assert_allclose(var[b, i, n], seen.var(0), atol=1e-4)


@pytest.mark.parametrize(
    "length,factor,prefix", [(7, 2, 0), (7, 3, 1), (9, 4, 2), (5, 8, 0)]
)
def test_pool_sequence_averages_valid_tokens(length, factor, prefix):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, length, 3)).astype("float32")
    valid = rng.random((2, length)) < 0.7
    pooled, counts = pooling.pool_sequence(x, factor, prefix, valid)
    wins = ref.windows(length, factor, prefix)
    assert pooled.shape == (2, pooling.pooled_length(length, factor, prefix), 3)
    pooled = ops.convert_to_numpy(pooled)
    for b in range(2):
        for w, members in enumerate(wins):
            members = [j for j in members if valid[b, j]]
            assert ops.convert_to_numpy(counts)[b, w] == len(members)
            if members and w >= prefix:
                assert_allclose(pooled[b, w], x[b, members].mean(0))


def test_pool_mask_requires_every_valid_token_of_window():
    mask = ref.causal(6, 6)[None, None]
    pooled = pooling.pool_mask(mask, np.ones((1, 6), bool), 2, 0)
    want = np.array([[w * 2 + 1 <= i for w in range(3)] for i in range(6)])
    np.testing.assert_array_equal(ops.convert_to_numpy(pooled)[0, 0], want)


@pytest.mark.parametrize(
    "length,factor,prefix", [(7, 2, 0), (7, 3, 1), (9, 4, 2), (5, 8, 0)]
)
def test_window_ends_are_the_last_position_of_each_full_span(
    length, factor, prefix
):
    got = ops.convert_to_numpy(pooling.window_ends(length, factor, prefix))
    assert got.tolist() == ref.window_ends(length, factor, prefix)


PLAN_CASES = [
    # (num_queries, num_keys, prefix, query padding, constraint, causal)
    (7, 9, 0, False, "padding", False),
    (7, 9, 1, True, "padding", True),
    (9, 7, 2, True, "rows", True),
    (7, 9, 1, False, "rows", False),
    (7, 7, 1, True, "per-head", True),
    (6, 6, 0, True, None, True),
    (5, 3, 3, False, "padding", True),  # prefix == length: nothing to pool
]


@pytest.mark.parametrize("kernel", ["softmax", "linear"])
@pytest.mark.parametrize(
    "num_queries,num_keys,prefix,query_padding,constraint,causal", PLAN_CASES
)
def test_plan_head_groups_matches_numpy_visibility(
    kernel, num_queries, num_keys, prefix, query_padding, constraint, causal
):
    if kernel == "linear" and constraint in ("rows", "per-head"):
        pytest.skip("the linear kernel takes key padding only")
    rng = np.random.default_rng(4)
    factors = (2, 1, 3, 1, 2)
    query_mask = key_padding = attention_mask = None
    if query_padding:
        query_mask = rng.random((2, num_queries)) < 0.7
        query_mask[:, 0] = True
    full = np.ones((2, 5, num_queries, num_keys), bool)
    if constraint == "padding":
        key_padding = rng.random((2, num_keys)) < 0.7
        full &= key_padding[:, None, None, :]
    elif constraint == "rows":
        attention_mask = rng.random((2, num_queries, num_keys)) < 0.6
        full &= attention_mask[:, None]
    elif constraint == "per-head":
        attention_mask = rng.random((2, 5, num_queries, num_keys)) < 0.6
        full &= attention_mask
    if query_mask is not None:
        full &= query_mask[:, None, :, None]
    plan = visibility.plan_head_groups(
        factors,
        prefix,
        num_queries,
        num_keys,
        query_mask=query_mask,
        key_padding=key_padding,
        attention_mask=visibility.attention_mask_4d(
            attention_mask, 5, (2, num_queries, num_keys)
        ),
        causal=causal,
        kernel=kernel,
    )
    assert [g.heads for g in plan] == [(0, 4), (1, 3), (2,)]
    nothing_to_pool = num_keys <= prefix
    for group, factor in zip(plan, (2, 1, 3), strict=True):
        assert group.factor == (1 if nothing_to_pool else factor)
        for index, head in enumerate(group.heads):
            want, _ = ref.pooled_visibility(
                full[:, head], group.factor, prefix, causal
            )
            shape = want.shape
            if kernel == "softmax":
                got = np.ones(shape, bool)
                if group.causal_only:
                    got &= ref.causal(num_queries, shape[2])[None]
                if group.mask is not None:
                    mask = ops.convert_to_numpy(group.mask)
                    mask = mask[:, min(index, mask.shape[1] - 1)]
                    got &= np.broadcast_to(mask, shape)
            else:
                weights = np.ones((1, shape[2]), bool)
                if group.key_weights is not None:
                    weights = ops.convert_to_numpy(group.key_weights) > 0
                got = np.broadcast_to(weights[:, None, :], shape).copy()
                if group.visible is not None:
                    seen = ops.convert_to_numpy(group.visible)
                    got &= np.arange(shape[2])[None, None] < seen[:, :, None]
                rows = np.ones((2, num_queries), bool)
                if query_mask is not None:
                    rows = query_mask  # padded rows are zeroed by the layer
                want, got = want[rows], got[rows]
            np.testing.assert_array_equal(got, want)
