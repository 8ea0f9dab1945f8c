"""Key statistics (`functional.statistics`) against masked NumPy moments."""

import numpy as np
import pytest
from keras import ops

from keras_svr_attention.functional import statistics
from tests import numpy_reference as ref
from tests.testing import assert_allclose


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
