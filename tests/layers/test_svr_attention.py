"""SVRAttention against NumPy (the paper's equations) and MultiHeadAttention.

The sizes, modes and inputs are `tests.testing`'s.
"""

import itertools

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests.testing import MODES
from tests.testing import B
from tests.testing import D
from tests.testing import N
from tests.testing import S
from tests.testing import T
from tests.testing import assert_allclose
from tests.testing import make_inputs
from tests.testing import make_masks
from tests.testing import random_weights
from tests.testing import reference
from tests.testing import slow_on_jax
from tests.testing import value_and_grad


def build_layer(mode, num_prefix_tokens=0, **kwargs):
    layer = ksa.SVRAttention(
        num_heads=N,
        key_dim=D,
        num_prefix_tokens=num_prefix_tokens,
        **MODES[mode],
        **kwargs,
    )
    return layer


CASES = list(
    itertools.product(
        MODES,
        ["none", "padding", "causal", "padding+causal", "random"],
        [0, 2],
    )
)


@pytest.mark.parametrize(
    "mode,mask_kind,prefix",
    CASES,
    ids=[f"{m}-{k}-prefix{p}" for m, k, p in CASES],
)
def test_svr_attention_matches_numpy_reference(mode, mask_kind, prefix):
    query, value, key = make_inputs()
    attention_mask, value_mask, causal = make_masks(mask_kind, T, S)
    layer = build_layer(mode, prefix)
    layer(query, value, key)
    random_weights(layer)
    out, scores = layer(
        query,
        value,
        key,
        attention_mask=attention_mask,
        value_mask=value_mask,
        use_causal_mask=causal,
        return_attention_scores=True,
    )
    fused = layer(
        query,
        value,
        key,
        attention_mask=attention_mask,
        value_mask=value_mask,
        use_causal_mask=causal,
    )
    want_out, want_scores = reference(
        layer,
        mode,
        query,
        value,
        key,
        attention_mask,
        value_mask,
        causal,
        num_prefix_tokens=prefix,
    )
    assert scores.shape == (B, N, T, S)
    # Dividing by s^2 = sigma^2 + 1e-5 amplifies float32 rounding.
    tol = 5e-5 if MODES[mode].get("standardize") else 1e-5
    assert_allclose(scores, want_scores, tol, tol, err_msg="scores")
    assert_allclose(out, want_out, tol, tol, err_msg="output (explicit)")
    assert_allclose(fused, want_out, tol, tol, err_msg="output (fused)")


QUERY_CAUSAL_CASES = list(itertools.product(MODES, ["softmax", "linear"]))


@pytest.mark.parametrize(
    "mode,kernel",
    QUERY_CAUSAL_CASES,
    ids=[f"{m}-{k}" for m, k in QUERY_CAUSAL_CASES],
)
def test_svr_attention_query_padding_under_causal_mask(mode, kernel):
    # Padded queries at the end (batch 0) and inside (batch 1): keys that
    # only padded queries could see leave the pooled windows, as in the
    # reference, which pools over the merged (B, T, S) mask.
    query, value, key = make_inputs()
    _, value_mask, _ = make_masks("padding", T, S)
    query_mask = np.ones((B, T), bool)
    query_mask[0, 4:] = False
    query_mask[1, [1, 5]] = False
    layer = build_layer(mode, num_prefix_tokens=1, kernel=kernel)
    layer(query, value, key)
    random_weights(layer)
    out, scores = layer(
        query,
        value,
        key,
        query_mask=query_mask,
        value_mask=value_mask,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    want_out, want_scores = reference(
        layer,
        mode,
        query,
        value,
        key,
        None,
        value_mask,
        True,
        kernel=kernel,
        query_mask=query_mask,
        num_prefix_tokens=1,
    )
    tol = 5e-5 if MODES[mode].get("standardize") else 1e-5
    assert_allclose(scores, want_scores, tol, tol, err_msg="scores")
    assert_allclose(out, want_out, tol, tol, err_msg="output")


@pytest.mark.parametrize("mode", list(MODES))
def test_svr_attention_scores_times_values_give_output(mode):
    """The spread scores times the unpooled values are each head's output."""
    query, value, key = make_inputs(self_attention=True)
    _, value_mask, _ = make_masks("padding", T, T)
    layer = build_layer(mode, num_prefix_tokens=1, use_bias=True)
    layer(query, value)
    random_weights(layer)
    out, scores = layer(
        query,
        value,
        value_mask=value_mask,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    values = layer.value_dense(value)  # (B, S, N, Dv), unpooled
    heads = ops.einsum("bnts,bsnd->btnd", scores, values)
    assert_allclose(layer.output_dense(heads), out)


@pytest.mark.parametrize("mode", ["softmax", "bn+sh"])
def test_svr_attention_value_dim_and_output_shape(mode):
    query, value, key = make_inputs()
    layer = build_layer(mode, value_dim=2, output_shape=11)
    layer(query, value, key)
    random_weights(layer)
    out = layer(query, value, key, use_causal_mask=True)
    want, _ = reference(layer, mode, query, value, key, None, None, True)
    assert out.shape == (B, T, 11)
    assert_allclose(out, want)


MASK_KINDS = ["none", "value_mask", "causal", "attention_mask", "query_mask"]


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_svr_attention_equals_mha_when_options_off(kind):
    query, value, key = make_inputs()
    mha = keras.layers.MultiHeadAttention(num_heads=N, key_dim=D)
    layer = ksa.SVRAttention(num_heads=N, key_dim=D)
    mha(query, value, key)
    layer(query, value, key)
    random_weights(mha)
    layer.set_weights(mha.get_weights())
    rng = np.random.default_rng(3)
    kwargs, rows = {}, np.ones((B, T), bool)
    if kind == "value_mask":
        kwargs["value_mask"] = np.arange(S)[None] < np.array([[S], [S - 3]])
    elif kind == "causal":
        kwargs["use_causal_mask"] = True
    elif kind == "attention_mask":
        mask = rng.random((B, T, S)) < 0.5
        mask[..., 0] = True
        kwargs["attention_mask"] = mask
    elif kind == "query_mask":
        rows = np.arange(T)[None] < np.array([[T], [T - 2]])
        kwargs["query_mask"] = rows
    want = ops.convert_to_numpy(mha(query, value, key, **kwargs))
    got = ops.convert_to_numpy(layer(query, value, key, **kwargs))
    assert_allclose(got[rows], want[rows])
    if kind == "query_mask":  # zero heads: the output is the output bias
        bias = ops.convert_to_numpy(layer.output_dense.bias)
        assert_allclose(got[~rows], np.broadcast_to(bias, got[~rows].shape))
    got, got_scores = layer(
        query, value, key, return_attention_scores=True, **kwargs
    )
    _, want_scores = mha(
        query, value, key, return_attention_scores=True, **kwargs
    )
    assert_allclose(ops.convert_to_numpy(got)[rows], want[rows])
    assert_allclose(
        ops.convert_to_numpy(got_scores).transpose(0, 2, 1, 3)[rows],
        ops.convert_to_numpy(want_scores).transpose(0, 2, 1, 3)[rows],
    )


def test_svr_attention_weights_match_mha_layout():
    mha = keras.layers.MultiHeadAttention(num_heads=N, key_dim=D)
    layer = ksa.AttentionBNSH(num_heads=N, key_dim=D)
    query, value, key = make_inputs()
    mha(query, value, key)
    layer(query, value, key)
    assert [w.shape for w in layer.weights] == [w.shape for w in mha.weights]
    assert [w.path.split("/")[-2:] for w in layer.weights] == [
        w.path.split("/")[-2:] for w in mha.weights
    ]


@pytest.mark.parametrize("mode", list(MODES))
def test_svr_attention_explicit_causal_equals_use_causal_mask(mode):
    query, value, _ = make_inputs(self_attention=True)
    layer = build_layer(mode, num_prefix_tokens=1)
    tril = np.broadcast_to(np.tril(np.ones((T, T), bool)), (B, T, T))
    layer(query, value)
    random_weights(layer)  # seeded: the gap below must not hang on init
    a = layer(query, value, use_causal_mask=True)
    b = layer(query, value, attention_mask=tril)
    # They differ only where a window is cut short by the end of the
    # sequence (docs/guide/rules.md, "Causal windows"): the explicit mask
    # lets the queries inside it see it, `use_causal_mask` does not.
    cut = (
        min(1 + (T - 2) // r * r for r in layer.head_factors if (T - 1) % r)
        if any((T - 1) % r for r in layer.head_factors)
        else T
    )
    assert_allclose(a[:, :cut], b[:, :cut])
    if cut < T:
        # Well above assert_allclose's 1e-5 tolerance.
        assert np.abs(ops.convert_to_numpy(a - b)[:, cut:]).max() > 1e-3


@pytest.mark.parametrize("mode", list(MODES))
def test_svr_attention_padding_via_mask_or_value_mask(mode):
    query, value, key = make_inputs()
    _, value_mask, _ = make_masks("padding", T, S)
    layer = build_layer(mode, num_prefix_tokens=1)
    a = layer(query, value, key, value_mask=value_mask)
    b = layer(query, value, key, attention_mask=value_mask[:, None, :])
    assert_allclose(a, b)


@pytest.mark.parametrize("mode", list(MODES))
def test_svr_attention_appended_padding_changes_nothing(mode):
    query, value, _ = make_inputs(self_attention=True)
    layer = build_layer(mode, num_prefix_tokens=1)
    short = layer(query, value, use_causal_mask=True)
    padded = np.concatenate([value, np.full((B, 5, 6), 7.0, "float32")], 1)
    mask = np.arange(T + 5)[None].repeat(B, 0) < T
    long = layer(query, padded, value_mask=mask, use_causal_mask=True)
    assert_allclose(long, short)


@pytest.mark.parametrize("mode", list(MODES))
def test_svr_attention_future_tokens_do_not_leak(mode):
    query, _, _ = make_inputs(self_attention=True)
    layer = build_layer(mode, num_prefix_tokens=1)
    edited = query.copy()
    edited[:, 4:] += 3.0
    a = ops.convert_to_numpy(layer(query, query, use_causal_mask=True))
    b = ops.convert_to_numpy(layer(edited, edited, use_causal_mask=True))
    assert_allclose(a[:, :4], b[:, :4])
    assert not np.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("mode", list(MODES))
def test_svr_attention_fully_masked_rows_are_zero(mode):
    query, value, key = make_inputs()
    mask = np.ones((B, T, S), bool)
    mask[1, 3] = False
    mask[0] = False
    layer = build_layer(mode, dropout=0.1)
    for training in (False, True):
        out = ops.convert_to_numpy(
            layer(query, value, key, attention_mask=mask, training=training)
        )
        assert np.isfinite(out).all()
        heads = layer.output_dense.bias  # output = bias where heads are 0
        assert_allclose(
            out[0], np.broadcast_to(ops.convert_to_numpy(heads), out[0].shape)
        )
        assert_allclose(out[1, 3], ops.convert_to_numpy(heads))


@pytest.mark.parametrize(
    "options,causal",
    [({"head_factors": [1, 2]}, True), ({"standardize": True}, False)],
    ids=["bn+sh-causal", "bn-std"],
)
@slow_on_jax
def test_svr_attention_gradient_flows_through_mean(options, causal):
    """Central finite differences agree with autodiff through mu.

    Were mu treated as a constant, autodiff would miss d mu / d k and
    disagree with the differences. float32 (Keras computes float64 as
    float32 on jax and torch), step 1e-3, tolerance atol = rtol = 2e-3.
    """
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 5, 4)).astype("float32")
    layer = ksa.SVRAttention(num_heads=2, key_dim=3, beta=1.0, **options)
    layer(x, x, use_causal_mask=causal)
    random_weights(layer)
    probe = rng.normal(size=(1, 5, 4)).astype("float32")

    def f(inputs):
        inputs = ops.convert_to_tensor(inputs, "float32")
        y = layer(inputs, inputs, use_causal_mask=causal)
        return ops.sum(y * ops.convert_to_tensor(probe))

    _, grad = value_and_grad(f, x)
    grad = ops.convert_to_numpy(grad)
    eps = 1e-3
    numeric = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        diff = ops.convert_to_numpy(f(plus)) - ops.convert_to_numpy(f(minus))
        numeric[idx] = float(diff) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, atol=2e-3, rtol=2e-3)


def test_svr_attention_learned_beta_trains():
    # One SGD step moves beta by -lr * dLoss/dbeta, the derivative taken
    # by central finite differences through the model (mu and all).
    layer = ksa.SVRAttention(num_heads=2, key_dim=3, beta=0.5, learn_beta=True)
    inputs = keras.Input((T, 6))
    x = layer(inputs, inputs)
    model = keras.Model(
        inputs, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(x))
    )
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(8, T, 6)) + 2.0).astype("float32")
    y = rng.normal(size=(8, 1)).astype("float32")

    def loss(beta):
        layer.beta_weight.assign(beta)
        pred = ops.convert_to_numpy(model(x)).astype("float64")
        return np.mean((pred - y) ** 2)

    eps = 1e-2
    grad = (loss(0.5 + eps) - loss(0.5 - eps)) / (2 * eps)
    layer.beta_weight.assign(0.5)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert layer.beta_weight.trainable
    moved = float(ops.convert_to_numpy(layer.beta_weight)) - 0.5
    assert abs(grad) > 1e-3  # beta matters to the loss
    np.testing.assert_allclose(moved, -0.1 * grad, rtol=2e-2, atol=1e-5)


def test_svr_attention_dropout_only_in_training():
    query, value, key = make_inputs()
    layer = ksa.SVRAttention(num_heads=N, key_dim=D, dropout=0.5, seed=1)
    a = layer(query, value, key, training=False)
    b = layer(query, value, key, training=False)
    c = layer(query, value, key, training=True)
    assert_allclose(a, b)
    assert not np.allclose(ops.convert_to_numpy(a), ops.convert_to_numpy(c))


def test_svr_attention_keras_mask_propagation():
    tokens = np.array([[3, 4, 5, 6, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]])
    embed = keras.layers.Embedding(10, 6, mask_zero=True)
    layer = ksa.AttentionBNSH(num_heads=2, key_dim=3, head_factors=[1, 2])
    x = embed(tokens)
    auto = layer(x, x)
    mask = tokens != 0
    explicit = layer(x, x, query_mask=mask, value_mask=mask)
    assert_allclose(auto, explicit)
    inputs = keras.Input((7,), dtype="int32")
    y = layer(embed(inputs), embed(inputs))
    pooled = keras.layers.GlobalAveragePooling1D()(y)
    model = keras.Model(inputs, pooled)
    got = ops.convert_to_numpy(model(tokens))
    manual = ops.convert_to_numpy(explicit)
    want = np.stack([manual[0, :4].mean(0), manual[1].mean(0)])
    assert_allclose(got, want)


def test_svr_attention_symbolic_scores_shape():
    layer = ksa.AttentionBNSH(num_heads=N, key_dim=D)
    q, v = keras.Input((T, 6)), keras.Input((S, 5))
    out, scores = layer(q, v, return_attention_scores=True)
    assert out.shape == (None, T, 6)
    assert scores.shape == (None, N, T, S)
    assert layer.compute_output_shape((None, T, 6), (None, S, 5)) == (
        None,
        T,
        6,
    )


def test_hook_runs_once_per_group_under_float16_standardize():
    calls = []

    class Counting(ksa.SVRAttention):
        def _compute_attention(self, query, key, value, *args, **kwargs):
            calls.append(query.shape[2])
            return super()._compute_attention(
                query, key, value, *args, **kwargs
            )

    layer = Counting(
        num_heads=4,
        key_dim=3,
        beta=1.0,
        standardize=True,
        head_factors=[1, 2, 1, 2],
        dtype="float16",
    )
    query, value, key = make_inputs()
    layer(query, value, key)
    calls.clear()
    out = layer(query, value, key, use_causal_mask=True)
    assert calls == [2, 2]  # one call per group of two heads
    assert np.all(np.isfinite(ops.convert_to_numpy(out)))


def test_hook_override_with_the_older_signature_keeps_working():
    # The signature before Keras 3.15 (no `use_causal_mask`), which
    # MultiHeadAttention still supports: it gets the finished causal mask.
    class Older(ksa.SVRAttention):
        def _compute_attention(
            self,
            query,
            key,
            value,
            attention_mask=None,
            training=None,
            return_attention_scores=False,
        ):
            return super()._compute_attention(
                query,
                key,
                value,
                attention_mask,
                training,
                return_attention_scores,
            )

    query, value, _ = make_inputs(self_attention=True)
    for options in ({}, {"beta": 1.0, "head_factors": [1, 2, 3, 2]}):
        base = ksa.SVRAttention(num_heads=N, key_dim=D, **options)
        older = Older(num_heads=N, key_dim=D, **options)
        base(query, value)
        older(query, value)
        random_weights(base)
        older.set_weights(base.get_weights())
        assert_allclose(
            older(query, value, use_causal_mask=True),
            base(query, value, use_causal_mask=True),
        )


@pytest.mark.skipif(
    keras.config.backend() == "tensorflow",
    reason="TensorFlow has no fused kernel, so no flash attention",
)
def test_flash_error_names_the_setting_in_effect():
    layer = ksa.SVRAttention(num_heads=2, key_dim=3, flash_attention=True)
    query, value, _ = make_inputs(self_attention=True)
    with pytest.raises(ValueError, match=r"flash_attention=True, in effect"):
        layer(query, value, return_attention_scores=True)


def test_per_head_masks_equal_multi_head_attention():
    query, value, key = make_inputs()
    mha = keras.layers.MultiHeadAttention(num_heads=N, key_dim=D)
    layer = ksa.SVRAttention(num_heads=N, key_dim=D)
    mha(query, value, key)
    layer(query, value, key)
    random_weights(mha)
    layer.set_weights(mha.get_weights())
    mask = np.random.default_rng(7).random((B, N, T, S)) < 0.6
    mask[..., 0] = True  # every row sees a key (MHA: uniform otherwise)
    assert_allclose(
        layer(query, value, key, attention_mask=mask),
        mha(query, value, key, attention_mask=mask),
    )


@pytest.mark.parametrize("mode", ["bn", "sh", "bn+sh"])
def test_per_head_masks_match_numpy_reference_head_by_head(mode):
    # Head h under a per-head mask equals head h of the layer given that
    # head's mask for every head (every key is seen by some query here, so
    # pooled windows hold the same tokens either way).
    query, value, key = make_inputs()
    layer = build_layer(mode)
    layer(query, value, key)
    random_weights(layer)
    mask = np.random.default_rng(8).random((B, N, T, S)) < 0.7
    got = layer(
        query, value, key, attention_mask=mask, return_attention_scores=True
    )[1]
    for h in range(N):
        one = layer(
            query,
            value,
            key,
            attention_mask=mask[:, h],
            return_attention_scores=True,
        )[1]
        assert_allclose(got[:, h], one[:, h], err_msg=f"head {h}")
