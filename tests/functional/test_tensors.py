"""The functional core's tensor helpers (`functional._tensors`) against
NumPy."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_svr_attention.functional import _tensors


@pytest.mark.parametrize(
    "axis, before, after", [(1, 0, 2), (1, 3, 0), (2, 1, 1), (0, 0, 0)]
)
def test_zero_pad_matches_numpy_pad(axis, before, after):
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
    widths = [(0, 0)] * 3
    widths[axis] = (before, after)
    got = _tensors.zero_pad(ops.convert_to_tensor(x), axis, before, after)
    np.testing.assert_array_equal(ops.convert_to_numpy(got), np.pad(x, widths))


@pytest.mark.parametrize("batch", [1, 2])
def test_gather_prefix_takes_entry_n_minus_one_and_zero_for_none(batch):
    rng = np.random.default_rng(0)
    prefix = rng.normal(size=(2, 5, 3)).astype("float32")
    lengths = rng.integers(0, 6, size=(batch, 4)).astype("int32")
    got = ops.convert_to_numpy(
        _tensors.gather_prefix(ops.convert_to_tensor(prefix), lengths)
    )
    want = np.zeros((2, 4, 3), "float32")
    for b in range(2):
        for t, n in enumerate(lengths[min(b, batch - 1)]):
            if n:
                want[b, t] = prefix[b, n - 1]
    np.testing.assert_array_equal(got, want)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(
    factor=st.integers(1, 4),
    prefix=st.integers(0, 2),
    num_keys=st.integers(3, 9),
    extra_queries=st.integers(-2, 3),
)
def test_align_prefix_is_gather_prefix_at_the_causal_lengths(
    factor, prefix, num_keys, extra_queries
):
    # Queries at positions 0..T-1 over keys pooled by `factor` after
    # `prefix` tokens: laid on positions or gathered, the same entries.
    num_queries = num_keys + extra_queries
    pooled = prefix + -(-(num_keys - prefix) // factor)
    sums = np.random.default_rng(0).normal(size=(2, pooled, 3))
    sums = sums.astype("float32")
    rows = np.arange(num_queries)
    lengths = np.minimum(
        np.minimum(rows + 1, prefix)
        + np.maximum(rows + 1 - prefix, 0) // factor,
        pooled,
    )[None].astype("int32")
    want = ops.convert_to_numpy(_tensors.gather_prefix(sums, lengths))
    got = _tensors.align_prefix(
        ops.convert_to_tensor(sums), factor, prefix, num_queries
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(got), want)
