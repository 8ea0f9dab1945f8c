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
        ({"dropout": "0.1"}, "dropout"),
        # Strings are not bools: "no" and "false" are truthy.
        ({"standardize": "no"}, "standardize"),
        ({"learn_beta": "false", "beta": 1.0}, "learn_beta"),
        ({"use_gate": "yes"}, "use_gate"),
        ({"flash_attention": "auto"}, "flash_attention"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": 2.5}, "sliding_window"),
        ({"sliding_window": 3, "kernel": "linear"}, "sliding_window"),
        ({"kernel": "linear", "dropout": 0.1}, "dropout"),
        ({"kernel": "cosine"}, "kernel"),
        ({"sparsity": "random", "block_size": 2}, "sparsity"),
        ({"sparsity": "local", "block_size": 0}, "block_size"),
        (
            {"sparsity": "local", "block_size": 2, "kernel": "linear"},
            "sparsity",
        ),
        ({"block_size": 2}, "block_size"),
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
        (_x(2, 7, 6), _x(2, 9, 5), _x(2, 8, 5), "must be equal"),
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


@pytest.mark.parametrize(
    "kwargs",
    [
        {"head_factors": np.array([1, 2, 2, 4])},
        {"head_factors": [np.int64(1), np.int32(2), 1, 1]},
        {"beta": np.float32(0.5), "learn_beta": np.bool_(True)},
        {"num_prefix_tokens": np.int64(2), "epsilon": np.float64(1e-4)},
        {"sparsity": "local", "block_size": np.int32(3)},
        {"standardize": np.bool_(True), "beta": np.int64(1)},
    ],
)
def test_svr_attention_accepts_numpy_numbers(kwargs):
    layer = ksa.SVRAttention(num_heads=4, key_dim=3, **kwargs)
    config = layer.get_config()
    for name in kwargs:
        value = config[name]
        assert type(value) in (int, float, bool, str, list), (name, value)


def test_use_gate_on_an_older_keras_says_which_keras(monkeypatch):
    from keras_svr_attention.layers import _validation

    monkeypatch.setattr(_validation, "keras_supports", lambda name: False)
    with pytest.raises(ValueError, match="`use_gate` needs Keras >= 3.14"):
        ksa.SVRAttention(num_heads=2, key_dim=3, use_gate=True)


def test_sparse_mask_rejects_unknown_pattern():
    from keras_svr_attention.functional import masks

    with pytest.raises(ValueError, match="`sparsity`"):
        masks.sparse_mask("diagonal", 4, 4, 2)


def test_stochastic_depth_rejects_bad_rate():
    with pytest.raises(ValueError, match="`rate`"):
        ksa.StochasticDepth(1.0)


def test_attention_maps_need_encoder_blocks():
    import keras

    inputs = keras.Input((4, 3))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(ValueError, match="`model` has no TransformerEncoder"):
        ksa.attention_maps(model, np.zeros((1, 4, 3), "float32"))


@pytest.mark.parametrize("preset", [ksa.AttentionSH, ksa.AttentionBNSH])
def test_presets_take_numpy_head_counts_like_python_ints(preset):
    want = (1, 1, 2, 2, 4, 4, 8, 8)
    assert preset(8, 16).head_factors == want
    assert preset(np.int64(8), 16).head_factors == want


@pytest.mark.parametrize(
    "name,options,option",
    [
        ("sh", {"beta": 0.5}, "beta"),
        ("softmax", {"head_factors": [1, 2, 1, 2]}, "head_factors"),
        ("linear+bn", {"head_factors": [1, 2, 1, 2]}, "head_factors"),
    ],
)
def test_get_refuses_options_its_name_does_not_use(name, options, option):
    with pytest.raises(ValueError, match=f"`{option}`.*'(bn|sh)'"):
        ksa.get(name, 4, 8, **options)
    # The builders' helper keeps only what the name uses.
    assert option not in ksa.options_used_by(name, **options)


def _inputs(batch=2, length=5, features=6):
    rng = np.random.default_rng(0)
    return rng.normal(size=(batch, length, features)).astype("float32")


@pytest.mark.parametrize(
    "argument,mask",
    [
        ("query_mask", np.ones((2, 6), bool)),
        ("value_mask", np.ones((2, 4), bool)),
        ("key_mask", np.ones((2, 7), bool)),
        ("query_mask", np.ones((2, 5, 1), bool)),
    ],
)
def test_masks_of_the_wrong_shape_name_the_mask(argument, mask):
    layer = ksa.AttentionBNSH(2, 4, head_factors=[1, 2])
    x, y = _inputs(), _inputs()
    key = _inputs() if argument == "key_mask" else None
    with pytest.raises(ValueError, match=f"`{argument}` must have shape"):
        layer(x, y, key, **{argument: mask})


def test_per_head_mask_with_another_head_count_is_refused():
    layer = ksa.SVRAttention(num_heads=4, key_dim=3)
    x = _inputs()
    with pytest.raises(ValueError, match=r"`attention_mask`.*\(B, N, T, S\)"):
        layer(x, x, attention_mask=np.ones((2, 3, 5, 5), bool))
