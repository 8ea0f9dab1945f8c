"""SVRGroupedQueryAttention against Keras's GroupQueryAttention and the op,
and Keras's own grouped_query_attention_test.py run against it."""

import importlib
import types

import keras
import numpy as np
import pytest

import keras_svr_attention as ksa
from tests.testing import MODES
from tests.testing import assert_allclose
from tests.testing import compiles_the_train_step
from tests.testing import covering_off_torch
from tests.testing import random_weights

B, T, S, F = 2, 7, 9, 10
ARGS = {"head_dim": 3, "num_query_heads": 4, "num_key_value_heads": 2}


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(B, T, F)).astype("float32"),
        rng.normal(size=(B, S, F)).astype("float32"),
    )


@pytest.mark.parametrize("mask", ["none", "causal", "padding", "attention"])
def test_options_off_equal_group_query_attention(mask):
    query, value = _inputs()
    if mask == "causal":
        value = query
    gqa = keras.layers.GroupQueryAttention(**ARGS)
    svr = ksa.SVRGroupedQueryAttention(**ARGS)
    gqa(query, value)
    svr(query, value)
    random_weights(gqa)
    svr.set_weights(gqa.get_weights())
    kwargs = {}
    if mask == "causal":
        kwargs["use_causal_mask"] = True
    elif mask == "padding":
        kwargs["value_mask"] = np.arange(S)[None] < np.array([[S], [4]])
    elif mask == "attention":
        m = np.random.default_rng(1).random((B, T, S)) < 0.6
        m[..., 0] = True
        kwargs["attention_mask"] = m
    assert_allclose(svr(query, value, **kwargs), gqa(query, value, **kwargs))


@pytest.mark.parametrize("kernel", ["softmax", "linear"])
def test_layer_is_the_op_on_its_projections(kernel):
    options = {"beta": 0.7, "head_factors": [1, 3], "kernel": kernel}
    layer = ksa.SVRGroupedQueryAttention(**ARGS, **options)
    query, _ = _inputs()
    want = layer(query, query, use_causal_mask=True)
    out = ksa.svr_dot_product_attention(
        layer._query_dense(query),
        layer._key_dense(query),
        layer._value_dense(query),
        is_causal=True,
        **options,
    )
    assert_allclose(layer._output_dense(out), want, 1e-5, 1e-5)


@compiles_the_train_step
def test_options_change_the_output_and_the_layer_trains_and_saves(tmp_path):
    inputs = keras.Input((None, F))
    layer = ksa.SVRGroupedQueryAttention(
        **ARGS, beta=1.0, head_factors=[1, 2], learn_beta=True
    )
    x = layer(inputs, inputs, use_causal_mask=True)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile("sgd", "mse", jit_compile=True)
    query, _ = _inputs()
    history = model.fit(query, np.ones((B, T, 1)), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    path = str(tmp_path / "gqa.keras")
    model.save(path)
    # Without the optimizer: a jit-compiled predict of each model would
    # compile twice more (a minute under torch.compile) and check nothing.
    loaded = keras.saving.load_model(path, compile=False)
    assert loaded.layers[1].head_factors == (1, 2)
    assert_allclose(loaded.predict(query, verbose=0), model(query))
    plain = ksa.SVRGroupedQueryAttention(**ARGS)
    plain(query, query)
    plain.set_weights([w for w in layer.get_weights() if w.shape != ()])
    diff = keras.ops.convert_to_numpy(
        plain(query, query, use_causal_mask=True)
        - layer(query, query, use_causal_mask=True)
    )
    assert np.abs(diff).max() > 1e-4


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"head_factors": [1, 2, 2, 4]}, "head_factors"),
        ({"num_key_value_heads": 3}, "num_query_heads"),
        ({"beta": -1.0}, "beta"),
        ({"kernel": "cosine"}, "kernel"),
    ],
)
def test_bad_options_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        ksa.SVRGroupedQueryAttention(**{**ARGS, **kwargs})


def test_replace_attention_converts_group_query_attention():
    inputs = keras.Input((T, F))
    x = keras.layers.GroupQueryAttention(**ARGS)(inputs, inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    random_weights(model)
    query, _ = _inputs()
    same = ksa.replace_attention(model, "softmax")
    assert isinstance(same.layers[1], ksa.SVRGroupedQueryAttention)
    assert_allclose(same(query), model(query))
    new = ksa.replace_attention(model, "bn+sh", head_factors=[1, 2])
    assert new.layers[1].head_factors == (1, 2)
    assert isinstance(model.layers[1], keras.layers.GroupQueryAttention)
    assert type(model.layers[1]) is keras.layers.GroupQueryAttention


keras_tests = pytest.importorskip(
    "keras.src.layers.attention.grouped_query_attention_test"
)


class _Layers(types.ModuleType):
    """`keras.layers` with SVRGroupedQueryAttention in its place."""

    GroupedQueryAttention = ksa.SVRGroupedQueryAttention
    GroupQueryAttention = ksa.SVRGroupedQueryAttention

    def __getattr__(self, name):
        return getattr(importlib.import_module("keras.src.layers"), name)


keras_tests.layers = _Layers("layers")


class TestKerasGroupedQueryAttentionSuite(
    keras_tests.GroupedQueryAttentionTest
):
    pass


EQUIVALENCE_MODES = {
    **MODES,
    "linear": {"kernel": "linear"},
    "linear-bn+sh": {
        "kernel": "linear",
        "beta": 0.5,
        "head_factors": [1, 2, 1, 3],
    },
}


# Every mode and mask in float32, and every mode in half precision with
# padding: covering (suite, tests/testing.py); the other half-precision
# masks on torch.
EQUIVALENCE_CASES = [
    (mode, mask, dtype)
    for mode in EQUIVALENCE_MODES
    for mask in ("none", "causal", "padding", "attention")
    for dtype in ("float32", "float16", "bfloat16")
]


@pytest.mark.parametrize(
    "mode,mask,dtype",
    covering_off_torch(
        EQUIVALENCE_CASES,
        [
            c
            for c in EQUIVALENCE_CASES
            if c[2] == "float32" or c[1] == "padding"
        ],
        ids=["-".join(c) for c in EQUIVALENCE_CASES],
    ),
)
def test_as_many_key_value_heads_as_query_heads_is_svr_attention(
    mode, mask, dtype
):
    # One forward for both layers: with K = N and SVRAttention's weights (the
    # same layout), outputs and scores agree in every mode, mask and dtype.
    # Regressions: GQA's float16 outputs went non-finite under `standardize`
    # (the float32 upcast lived in SVRAttention only), and its linear kernel
    # gave padded queries nonzero scores.
    options = EQUIVALENCE_MODES[mode]
    heads = len(options.get("head_factors", [0] * 4))
    svr = ksa.SVRAttention(num_heads=heads, key_dim=3, dtype=dtype, **options)
    gqa = ksa.SVRGroupedQueryAttention(
        head_dim=3,
        num_query_heads=heads,
        num_key_value_heads=heads,
        dtype=dtype,
        **options,
    )
    x = np.random.default_rng(3).normal(size=(B, T, F)).astype("float32")
    svr(x, x)
    gqa(x, x)
    random_weights(svr)
    gqa.set_weights(svr.get_weights())
    kwargs = {"return_attention_scores": True}
    if mask == "causal":
        kwargs["use_causal_mask"] = True
    elif mask == "padding":
        padding = np.arange(T)[None] < np.array([[T], [4]])
        kwargs["query_mask"] = kwargs["value_mask"] = padding
    elif mask == "attention":
        if options.get("kernel") == "linear":
            pytest.skip("the linear kernel takes padding and causal masks")
        m = np.random.default_rng(1).random((B, T, T)) < 0.6
        m[0, 2] = False  # a row that sees no key
        kwargs["attention_mask"] = m
    want, want_scores, got, got_scores = (
        keras.ops.convert_to_numpy(keras.ops.cast(value, "float32"))
        for value in (*svr(x, x, **kwargs), *gqa(x, x, **kwargs))
    )
    for value in (got, got_scores):
        assert np.isfinite(value).all()
    # float16 keeps 11 bits and bfloat16 8: 2e-2 and 1e-1 relative on
    # unit-scale outputs, the same computation in the same order on both
    # sides (float32: exact but for the sum order of the projections).
    tol = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 1e-1}[dtype]
    assert_allclose(got, want, tol, tol)
    assert_allclose(got_scores, want_scores, tol, tol)
