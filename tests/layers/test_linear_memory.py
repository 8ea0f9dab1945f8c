"""Linear attention never materialises a T x S matrix: XLA's compiled
temporary memory grows ~linearly in T (JAX only: a count, not a timing)."""

import numpy as np
import pytest

import keras_svr_attention as ksa
from tests.testing import BACKEND

pytestmark = pytest.mark.skipif(
    BACKEND != "jax", reason="reads XLA's compiled memory analysis (JAX)"
)


def _temp_bytes(kernel, length, causal):
    import jax

    layer = ksa.SVRAttention(
        num_heads=2, key_dim=16, kernel=kernel, beta=1.0, head_factors=[1, 2]
    )
    x = np.zeros((1, length, 32), "float32")
    layer(x[:, :8], x[:, :8])
    trainable = [v.value for v in layer.trainable_variables]

    def f(trainable, x):
        y, _ = layer.stateless_call(trainable, [], x, x, use_causal_mask=causal)
        return y

    spec = jax.ShapeDtypeStruct(x.shape, "float32")
    compiled = jax.jit(f).lower(trainable, spec).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_linear_attention_memory_grows_linearly(causal):
    small = _temp_bytes("linear", 1024, causal)
    large = _temp_bytes("linear", 8192, causal)
    # 8x the length: ~8x the memory for O(T), 64x for a T x S matrix.
    assert large / small < 12, (small, large)
    softmax = _temp_bytes("softmax", 8192, causal)
    assert large < softmax / 4, (large, softmax)
