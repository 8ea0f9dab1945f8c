"""The visibility planner (`functional.visibility`) against NumPy."""

import numpy as np
import pytest
from keras import ops

from keras_svr_attention.functional import visibility
from keras_svr_attention.functional.options import SVROptions
from tests import numpy_reference as ref

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
    options = SVROptions(
        head_factors=factors, num_prefix_tokens=prefix, kernel=kernel
    )
    plan = visibility.plan_head_groups(
        options,
        num_queries,
        num_keys,
        query_mask=query_mask,
        key_padding=key_padding,
        attention_mask=visibility.attention_mask_4d(
            attention_mask, 5, (2, num_queries, num_keys)
        ),
        causal=causal,
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
                if group.causal:
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
                if group.causal_prefix is not None:
                    seen = group.causal_prefix.lengths
                    seen = ops.convert_to_numpy(seen)
                    got &= np.arange(shape[2])[None, None] < seen[:, :, None]
                rows = np.ones((2, num_queries), bool)
                if query_mask is not None:
                    rows = query_mask  # padded rows are zeroed by the layer
                want, got = want[rows], got[rows]
            np.testing.assert_array_equal(got, want)
