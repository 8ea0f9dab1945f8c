"""The mask builders (`functional.masks`) against NumPy."""

import numpy as np
import pytest
from keras import ops

from keras_svr_attention.functional import masks
from tests import numpy_reference as ref


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
