"""Sequence pooling (`functional.pooling`) against NumPy."""

import numpy as np
import pytest
from keras import ops

from keras_svr_attention.functional import pooling
from tests import numpy_reference as ref
from tests.testing import assert_allclose


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
    pooled = ops.arange(pooling.pooled_length(length, factor, prefix))
    got = ops.convert_to_numpy(pooling.span_ends(pooled, factor, prefix))
    assert got.tolist() == ref.window_ends(length, factor, prefix)
