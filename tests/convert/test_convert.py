"""replace_attention on Keras models, and cached decoding of the SVR layer.

Each converted layer is checked against the original model (options off)
or against an SVR layer built by hand with the original weights.
"""

import warnings

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests.testing import MODES
from tests.testing import assert_allclose
from tests.testing import random_weights
from tests.testing import slow_on_jax

FEATURES, LENGTH = 8, 6


def _data(seed=0, length=LENGTH):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(2, length, FEATURES)).astype("float32")


def _functional(dtype=None):
    inputs = keras.Input((LENGTH, FEATURES))
    x = keras.layers.MultiHeadAttention(
        num_heads=4,
        key_dim=3,
        value_dim=2,
        dropout=0.1,
        kernel_initializer="he_normal",
        name="attention",
        dtype=dtype,
    )(inputs, inputs, use_causal_mask=True)
    outputs = keras.layers.Dense(3, name="head")(x)
    model = keras.Model(inputs, outputs)
    random_weights(model)
    return model


@keras.saving.register_keras_serializable(package="tests")
class AttentionHolder(keras.layers.Layer):
    """Holds its attention as an attribute built in build(), as KerasHub's
    TransformerEncoder does."""

    def build(self, shape):
        self.attention = keras.layers.MultiHeadAttention(2, 4, name="inner")
        self.attention.build(shape, shape)
        self.project = keras.layers.Dense(FEATURES, name="project")
        self.project.build(shape)

    def call(self, x):
        return self.project(self.attention(x, x, use_causal_mask=True)) + x


def _sequential_with_holder():
    model = keras.Sequential(
        [
            keras.Input((LENGTH, FEATURES)),
            AttentionHolder(),
            keras.layers.Dense(2),
        ]
    )
    random_weights(model)
    return model


def _nested():
    inner = _functional()
    inputs = keras.Input((LENGTH, FEATURES))
    outputs = keras.layers.Dense(2)(inner(inputs))
    model = keras.Model(inputs, outputs)
    random_weights(model)
    return model


BUILDERS = {
    "functional": _functional,
    "sequential_holder": _sequential_with_holder,
    "nested": _nested,
}


def _attention_layers(model):
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.MultiHeadAttention)
    ]


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_softmax_conversion_computes_what_the_model_did(kind):
    model = BUILDERS[kind]()
    x = _data()
    want = model(x)
    new = ksa.replace_attention(model, "softmax")
    assert_allclose(new(x), want)
    (old,), (converted,) = _attention_layers(model), _attention_layers(new)
    assert type(old) is keras.layers.MultiHeadAttention  # left unchanged
    assert isinstance(converted, ksa.SVRAttention)
    assert len(new.weights) == len(model.weights)
    assert_allclose(model(x), want, 0, 0)


CONVERSIONS = {
    "bn": {"beta": 0.8},
    "bn-std": {"beta": 0.6, "standardize": True},
    "sh": {},
    "bn+sh": {"beta": 1.0},
}


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("mode", list(CONVERSIONS))
def test_conversion_equals_the_layer_built_by_hand(kind, mode):
    model = BUILDERS[kind]()
    (old,) = _attention_layers(model)
    name = mode.replace("-std", "")
    options = dict(CONVERSIONS[mode])
    if "sh" in name:
        options["head_factors"] = [1, 2] if old.num_heads == 2 else [1, 1, 2, 4]
    new = ksa.replace_attention(model, name, **options)
    (converted,) = _attention_layers(new)
    config, old_config = converted.get_config(), old.get_config()
    for key in ("num_heads", "key_dim", "value_dim", "dropout", "name"):
        assert config[key] == old_config[key], key
    assert config["kernel_initializer"] == old_config["kernel_initializer"]
    for got, want in zip(converted.weights, old.weights, strict=True):
        assert_allclose(got, want, 0, 0)
    # The same attention built by hand from the old layer's sizes, the
    # requested options and the old weights.
    by_hand = ksa.get(
        name,
        num_heads=old.num_heads,
        key_dim=old.key_dim,
        value_dim=old.value_dim,
        dropout=old.dropout,
        **options,
    )
    x = _data(1)
    by_hand(x, x)
    by_hand.set_weights(old.get_weights())
    got = converted(x, x, use_causal_mask=True)
    assert_allclose(got, by_hand(x, x, use_causal_mask=True))
    # The options took effect: the converted model differs from the old.
    assert np.abs(ops.convert_to_numpy(new(x) - model(x))).max() > 1e-4


def test_training_the_converted_model_leaves_the_original_intact():
    model = _functional()
    x = _data()
    want = model(x)
    new = ksa.replace_attention(model, "bn+sh", head_factors=[1, 1, 2, 4])
    new.compile(optimizer="sgd", loss="mse")
    new.fit(x, np.zeros((2, LENGTH, 3), "float32"), epochs=2, verbose=0)
    assert_allclose(model(x), want, 0, 0)
    again = ksa.replace_attention(model, "softmax")  # still convertible
    assert_allclose(again(x), want)


def test_conversion_keeps_the_dtype_policy():
    model = _functional(dtype="mixed_bfloat16")
    new = ksa.replace_attention(model, "bn+sh", head_factors=[1, 1, 2, 4])
    (converted,) = _attention_layers(new)
    assert converted.dtype_policy.name == "mixed_bfloat16"


def test_no_attention_layer_is_an_error():
    inputs = keras.Input((LENGTH, FEATURES))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(ValueError, match="has no MultiHeadAttention"):
        ksa.replace_attention(model)


def test_unknown_attention_name_is_an_error():
    with pytest.raises(ValueError, match="`attention` must be one of"):
        ksa.replace_attention(_functional(), "bm+sh")


def test_options_that_do_not_fit_name_the_layer_and_change_nothing():
    model = _functional()
    with pytest.raises(ValueError, match="'attention'.*`head_factors`"):
        ksa.replace_attention(model, "sh", head_factors=[1, 2])
    (old,) = _attention_layers(model)
    assert type(old) is keras.layers.MultiHeadAttention


def _model_with_unsupported():
    inputs = keras.Input((LENGTH, FEATURES))
    x = keras.layers.MultiHeadAttention(2, 4, name="ok")(inputs, inputs)
    y = keras.layers.AdditiveAttention(name="additive")([x, x])
    grid = keras.Input((3, 4, FEATURES))
    z = keras.layers.MultiHeadAttention(
        2, 4, attention_axes=(1, 2), name="axes"
    )(grid, grid)
    return keras.Model([inputs, grid], [y, z])


def test_unconvertible_layers_are_named_or_skipped():
    model = _model_with_unsupported()
    with pytest.raises(ValueError, match="'additive'.*AdditiveAttention"):
        ksa.replace_attention(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = ksa.replace_attention(model, skip_unsupported=True)
    messages = " ".join(str(w.message) for w in caught)
    assert "'additive'" in messages and "'axes'" in messages
    assert "attention_axes" in messages
    assert isinstance(new.get_layer("ok"), ksa.SVRAttention)
    assert type(new.get_layer("axes")) is keras.layers.MultiHeadAttention


def test_model_must_be_a_built_model():
    with pytest.raises(ValueError, match="`model` must be a keras.Model"):
        ksa.replace_attention(keras.layers.Dense(2))
    with pytest.raises(ValueError, match="`model` must be built"):
        ksa.replace_attention(keras.Sequential([keras.layers.Dense(2)]))


# Cached decoding ---------------------------------------------------------


CACHE_MODES = ["softmax", "bn", "bn-std", "sh", "bn+sh"]
# The linear kernel decodes too (KerasHub's cache contract).
CACHE_MODES += ["linear", "linear+bn", "linear+sh", "linear+bn+sh"]
# SH under a sliding window: a step's band sees the full forward's windows.
CACHE_MODES += ["bn+sh-window"]


def _decoder(mode, num_layers=2):
    kernel, _, rest = mode.partition("+") if "linear" in mode else ("", 0, mode)
    options = {"kernel": "linear"} if kernel else {}
    if kernel and rest:
        options.update(
            {
                "bn": {"beta": 0.8},
                "sh": {"head_factors": [1, 2, 3, 2]},
                "bn+sh": {"beta": 1.0, "head_factors": [2, 1, 1, 4]},
            }[rest]
        )
    elif mode.endswith("-window"):
        options = {**MODES[mode.removesuffix("-window")], "sliding_window": 3}
    elif not kernel:
        options = MODES[mode]
    layers = [
        ksa.SVRAttention(num_heads=4, key_dim=3, **options)
        for _ in range(num_layers)
    ]
    x = _data(2, length=9)
    for layer in layers:
        layer(x, x)
        random_weights(layer, seed=len(layers))
    return layers


def _full_forward(layers, x):
    for layer in layers:
        x = ops.add(x, layer(x, x, use_causal_mask=True))
    return x


@slow_on_jax  # one length per step, each compiled anew by eager JAX
@pytest.mark.parametrize("mode", CACHE_MODES)
def test_token_by_token_decoding_equals_the_full_causal_forward(mode):
    # Two stacked layers: the second one's cached keys come from the first
    # one's outputs at earlier steps, so a window seen too early (before all
    # its tokens exist) would show up here.
    layers = _decoder(mode)
    x = _data(3, length=9)
    want = ops.convert_to_numpy(_full_forward(layers, x))
    caches = [ops.zeros((2, 2, 9, 4, 3)) for _ in layers]
    prompt = 3
    # Seed the caches with the prompt, then one token at a time.
    steps = [(0, prompt)] + [(t, t + 1) for t in range(prompt, 9)]
    for start, stop in steps:
        h = ops.convert_to_tensor(x[:, start:stop])
        for i, layer in enumerate(layers):
            out, caches[i] = layer(
                h,
                h,
                cache=caches[i],
                cache_update_index=start,
                use_causal_mask=True,
            )
            h = ops.add(h, out)
        # float32 promises about 1e-5 of the largest value here (outputs
        # near 20, two residual layers, a cache read in another summation
        # order): assert_allclose scales its atol with that value (fixed
        # at 1e-5, it failed on one CPU).
        assert_allclose(h, want[:, start:stop])


def test_static_cache_reads_without_writing():
    (layer,) = _decoder("bn+sh", num_layers=1)
    x = _data(4, length=9)
    cache = ops.stack(
        [layer.key_dense(ops.convert_to_tensor(x)), layer.value_dense(x)],
        axis=1,
    )
    query = x[:, :2]
    got, same = layer(query, x, cache=cache)
    assert_allclose(got, layer(query, x), 1e-5, 1e-5)
    assert_allclose(same, cache, 0, 0)


def test_cache_errors():
    layer = ksa.SVRAttention(num_heads=2, key_dim=3)
    x = _data()
    with pytest.raises(ValueError, match="`cache_update_index` needs"):
        layer(x, x, cache_update_index=0)
    conv = ksa.SVRAttention(num_heads=2, key_dim=3, conv_kernel_size=3)
    cache = ops.zeros((2, 2, LENGTH, 2, 3))
    with pytest.raises(ValueError, match="`cache` needs no `conv_kernel"):
        conv(x, x, cache=cache, cache_update_index=0)
    with pytest.raises(ValueError, match="`value_mask`.*`cache_update_"):
        layer(x, x, value_mask=np.ones((2, LENGTH), bool), cache=cache)
