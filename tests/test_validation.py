"""Every bad input gets a ValueError that names the argument."""

import numpy as np
import pytest

import keras_svr_attention as ksa


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": -2}, "num_heads"),
        ({"num_heads": 1.5}, "num_heads"),
        ({"key_dim": 0}, "key_dim"),
        ({"value_dim": -1}, "value_dim"),
        ({"head_factors": [1, 2]}, "head_factors"),
        ({"head_factors": [1, 0, 1, 1]}, "head_factors"),
        ({"head_factors": [1, 1.5, 1, 1]}, "head_factors"),
        ({"beta": -0.1}, "beta"),
        ({"beta": float("nan")}, "beta"),
        ({"beta": float("inf")}, "beta"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1e-5}, "epsilon"),
        ({"epsilon": float("nan")}, "epsilon"),
        ({"num_prefix_tokens": -1}, "num_prefix_tokens"),
        ({"learn_beta": True}, "learn_beta=True"),
        ({"attention_axes": (1,)}, "attention_axes"),
        ({"dropout": 1.0}, "dropout"),
    ],
)
def test_svr_attention_rejects_bad_options(kwargs, name):
    args = {"num_heads": 4, "key_dim": 3, **kwargs}
    with pytest.raises(ValueError, match=f"`{name}"):
        ksa.SVRAttention(**args)


def _x(*shape):
    return np.zeros(shape, "float32")


@pytest.mark.parametrize(
    "query,value,key,name",
    [
        (_x(7, 6), _x(2, 9, 5), None, "query"),
        (_x(2, 7, 6), _x(9, 5), None, "value"),
        (_x(2, 7, 6), _x(2, 9, 5), _x(2, 9), "key"),
        (_x(2, 7, 6), _x(3, 9, 5), None, "batch size"),
        (_x(2, 7, 6), _x(2, 9, 5), _x(2, 8, 5), "same length"),
    ],
)
def test_svr_attention_rejects_bad_shapes(query, value, key, name):
    layer = ksa.SVRAttention(num_heads=4, key_dim=3)
    with pytest.raises(ValueError, match=name):
        layer(query, value, key)


def test_svr_attention_rejects_prefix_longer_than_sequence():
    layer = ksa.AttentionSH(num_heads=4, key_dim=3, num_prefix_tokens=10)
    with pytest.raises(ValueError, match="`num_prefix_tokens`"):
        layer(_x(2, 7, 6), _x(2, 9, 5))


@pytest.mark.parametrize("shape", [(2, 7, 8), (3, 7, 9), (7, 8), (2, 2, 7, 9)])
def test_svr_attention_rejects_mask_that_does_not_broadcast(shape):
    layer = ksa.SVRAttention(num_heads=4, key_dim=3)
    with pytest.raises(ValueError, match="`attention_mask`"):
        layer(_x(2, 7, 6), _x(2, 9, 5), attention_mask=np.ones(shape, bool))
