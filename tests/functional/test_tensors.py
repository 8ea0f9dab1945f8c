"""The functional core's tensor helpers (`functional._tensors`) against
NumPy."""

import numpy as np
import pytest
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
