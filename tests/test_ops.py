"""`svr_dot_product_attention` against Keras's op and the NumPy equations."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests import numpy_reference as ref
from tests.testing import assert_allclose

B, T, S, N, K, H = 2, 7, 9, 4, 2, 3


def _heads(seed=0, length=S, heads=K):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(B, length, heads, H)).astype("float32")


def _identity_weights(num_heads):
    """Projections that pass heads through: the reference then attends to
    the given heads, `(B, T, N * H)` laid out head by head."""
    eye = np.eye(num_heads * H).reshape(num_heads * H, num_heads, H)
    return {
        "wq": eye,
        "bq": np.zeros((num_heads, H)),
        "wk": eye,
        "bk": np.zeros((num_heads, H)),
        "wv": eye,
        "bv": np.zeros((num_heads, H)),
        "wo": eye.reshape(num_heads, H, num_heads * H),
        "bo": np.zeros(num_heads * H),
    }


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_op_with_options_off_equals_keras_dot_product_attention(causal):
    q = _heads(0, T if causal else T, N)
    length = T if causal else S
    k, v = _heads(1, length), _heads(2, length)
    mask = np.random.default_rng(3).random((B, 1, T, length)) < 0.7
    mask[..., 0] = True
    got = ksa.svr_dot_product_attention(q, k, v, mask=mask, is_causal=causal)
    repeat = N // K
    want = ops.dot_product_attention(
        q,
        np.repeat(k, repeat, axis=2),
        np.repeat(v, repeat, axis=2),
        mask=mask,
        is_causal=causal,
    )
    assert_allclose(got, want, 1e-5, 1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
def test_op_matches_numpy_equations_with_kv_heads(kernel, causal):
    # K/V head g serves query heads g * N/K ... : the reference runs N heads
    # on repeated K/V heads with each factor repeated likewise.
    length = T if causal else S
    q, k, v = _heads(0, T, N), _heads(1, length), _heads(2, length)
    got = ksa.svr_dot_product_attention(
        q,
        k,
        v,
        is_causal=causal,
        beta=0.8,
        head_factors=[1, 3],
        kernel=kernel,
        num_prefix_tokens=1,
    )
    flat = lambda x: np.repeat(x, N // x.shape[2], axis=2).reshape(  # noqa: E731
        B, x.shape[1], N * H
    )
    want, _ = ref.svr_attention(
        flat(q).astype("float64"),
        flat(v).astype("float64"),
        _identity_weights(N),
        key=flat(k).astype("float64"),
        causal_mask=causal,
        beta=0.8,
        head_factors=[1, 1, 3, 3],
        num_prefix_tokens=1,
        kernel=kernel,
    )
    assert_allclose(ops.reshape(got, (B, T, N * H)), want, 1e-4, 1e-4)


def test_op_is_the_layers_computation():
    # The layer's heads through the op give the layer's output.
    layer = ksa.SVRAttention(
        num_heads=N, key_dim=H, beta=1.0, head_factors=[1, 1, 2, 4]
    )
    x = np.random.default_rng(4).normal(size=(B, T, 5)).astype("float32")
    want = layer(x, x, use_causal_mask=True)
    heads = layer.query_dense(x), layer.key_dense(x), layer.value_dense(x)
    out = ksa.svr_dot_product_attention(
        *heads, is_causal=True, beta=1.0, head_factors=[1, 1, 2, 4]
    )
    assert_allclose(layer.output_dense(out), want, 1e-5, 1e-5)


def test_op_causal_offset_decodes_as_the_full_forward():
    q, k, v = _heads(0, S, N), _heads(1), _heads(2)
    options = {"beta": 1.0, "head_factors": [2, 3], "is_causal": True}
    full = ops.convert_to_numpy(
        ksa.svr_dot_product_attention(q, k, v, **options)
    )
    for t in range(S):
        step = ksa.svr_dot_product_attention(
            q[:, t : t + 1], k, v, causal_offset=t, **options
        )
        assert_allclose(step[:, 0], full[:, t], 1e-5, 1e-5, err_msg=f"t={t}")


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((B, T, 3, H), (B, S, 2, H), (B, S, 2, H)), "K dividing N"),
        (((B, T, H), (B, S, 2, H), (B, S, 2, H)), "query"),
    ],
)
def test_op_refuses_bad_shapes(shapes, match):
    q, k, v = (np.zeros(s, "float32") for s in shapes)
    with pytest.raises(ValueError, match=match):
        ksa.svr_dot_product_attention(q, k, v)


def test_op_refuses_head_factors_per_query_head():
    q, k, v = _heads(0, T, N), _heads(1), _heads(2)
    with pytest.raises(ValueError, match="`head_factors`.*num_heads=2"):
        ksa.svr_dot_product_attention(q, k, v, head_factors=[1, 1, 2, 2])


def test_op_traces_in_a_model_with_unknown_length():
    inputs = keras.Input((None, N, H))
    kv = keras.Input((None, K, H))
    out = keras.layers.Lambda(
        lambda t: ksa.svr_dot_product_attention(
            t[0], t[1], t[1], is_causal=True, beta=1.0, head_factors=[1, 2]
        )
    )([inputs, kv])
    model = keras.Model([inputs, kv], out)
    for length in (5, 8):
        q, k = _heads(0, length, N), _heads(1, length)
        want = ksa.svr_dot_product_attention(
            q, k, k, is_causal=True, beta=1.0, head_factors=[1, 2]
        )
        assert_allclose(model.predict([q, k], verbose=0), want, 1e-5, 1e-5)


@pytest.mark.parametrize("options", [{}, {"beta": 1.0, "head_factors": [1, 2]}])
def test_sliding_window_is_the_band_mask_at_the_causal_offset(options):
    # The band Qwen's hook applies, |offset + i - j| < w, given as a window
    # or as an explicit (B, N, T, S) mask built here: the same outputs.
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 3, 4, 8)).astype("float32")
    k, v = (rng.normal(size=(2, 7, 2, 8)).astype("float32") for _ in "kv")
    offset, window = 4, 3
    rows = offset + np.arange(3)[:, None]
    cols = np.arange(7)[None]
    band = (np.abs(rows - cols) < window) & (cols <= rows)
    got = ksa.svr_dot_product_attention(
        q, k, v, is_causal=True, causal_offset=offset, sliding_window=window,
        **options,
    )  # fmt: skip
    want = ksa.svr_dot_product_attention(
        q, k, v, mask=band[None, None], causal_offset=offset, is_causal=True,
        **options,
    )  # fmt: skip
    assert_allclose(got, want)
    with pytest.raises(ValueError, match="`sliding_window`.*linear"):
        ksa.svr_dot_product_attention(
            q, k, v, kernel="linear", sliding_window=2
        )


@pytest.mark.parametrize("beta", [None, 1.0])
def test_logit_soft_cap_caps_the_svr_logits(beta):
    # Gemma's soft-capping on the SVR logits: c tanh(s / c) of the
    # recentered query's scores, before the causal softmax (NumPy).
    rng = np.random.default_rng(5)
    q, k, v = (rng.normal(size=(2, 6, 2, 4)) * 2 for _ in "qkv")
    cap = 0.7
    got = ksa.svr_dot_product_attention(
        q.astype("float32"), k.astype("float32"), v.astype("float32"),
        is_causal=True, beta=beta, logit_soft_cap=cap,
    )  # fmt: skip
    lower = np.tril(np.ones((6, 6), bool))
    if beta:  # mu_i: the mean of keys 0..i, per sample and head
        mean = np.cumsum(k, axis=1) / np.arange(1, 7)[None, :, None, None]
        q = q - beta * mean
    logits = np.einsum("btnd,bsnd->bnts", q, k) / 2.0  # 1 / sqrt(4)
    logits = cap * np.tanh(logits / cap)
    logits = np.where(lower, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    assert_allclose(got, np.einsum("bnts,bsnd->btnd", weights, v))
    with pytest.raises(ValueError, match="`logit_soft_cap`.*linear"):
        ksa.svr_dot_product_attention(
            q, k, v, kernel="linear", logit_soft_cap=cap
        )


@pytest.mark.parametrize(
    "options",
    [{}, {"beta": 1.0}, {"beta": 0.5, "head_factors": [1, 2]}],
    ids=["softmax", "bn", "bn+sh"],
)
def test_attention_sinks_join_the_denominator_of_the_svr_softmax(options):
    # GPT-OSS's sinks against Attention-BN's exact logits, written plainly:
    # softmax over [(q_i - b mu_i)^T (k_j - b mu_i) / sqrt(D), s_h], the
    # sink's weight dropped; SH heads see their pooled windows.
    rng = np.random.default_rng(6)
    q = rng.normal(size=(2, 6, 4, 4))
    k, v = (rng.normal(size=(2, 6, 2, 4)) for _ in "kv")
    sinks = rng.normal(size=(4,))
    got = ksa.svr_dot_product_attention(
        *(x.astype("float32") for x in (q, k, v)), is_causal=True,
        sinks=ops.convert_to_tensor(sinks, "float32"), **options,
    )  # fmt: skip
    beta = options.get("beta", 0.0)
    want = np.zeros((2, 6, 4, 4))
    for h in range(4):
        g = h // 2  # the key/value head of query head h
        factor = options.get("head_factors", [1, 1])[g]
        kk, vv = k[:, :, g], v[:, :, g]
        if factor > 1:  # windows of 2 seen once their span has ended
            kk = kk.reshape(2, 3, 2, 4).mean(2)
            vv = vv.reshape(2, 3, 2, 4).mean(2)
        ends = np.arange(kk.shape[1]) * factor + factor - 1
        for i in range(6):
            seen = ends <= i
            if not seen.any():
                continue
            mu = kk[:, seen].mean(1)  # (B, D)
            qi = q[:, i, h] - beta * mu
            logits = np.einsum(
                "bd,bsd->bs", qi, kk[:, seen] - beta * mu[:, None]
            )
            logits = np.concatenate(
                [logits / 2.0, np.full((2, 1), sinks[h])], 1
            )
            w = np.exp(logits - logits.max(1, keepdims=True))
            w = w / w.sum(1, keepdims=True)
            want[:, i, h] = np.einsum("bs,bsd->bd", w[:, :-1], vv[:, seen])
    assert_allclose(got, want)


@pytest.mark.parametrize(
    "options",
    [{}, {"beta": 1.0}, {"beta": 0.5, "head_factors": [1, 3]}],
    ids=["softmax", "bn", "bn+sh"],
)
def test_alibi_key_bias_is_added_to_the_svr_logits(options):
    # Bloom's and Falcon's ALiBi on Attention-BN's logits, written plainly:
    # softmax_j((q_i - b mu_i)^T (k_j - b mu_i) / sqrt(D) + m_h j) over the
    # keys query i sees, padding included; an SH head pools its bias with
    # its keys: m_h times the mean position of a window's valid keys.
    rng = np.random.default_rng(7)
    q = rng.normal(size=(2, 7, 4, 4))
    k, v = (rng.normal(size=(2, 7, 2, 4)) for _ in "kv")
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    positions = np.arange(7.0)
    bias = slopes[None, :, None] * positions[None, None, :]  # (1, N, S)
    valid = np.ones((2, 7), bool)
    valid[1, 5:] = False  # right padding of the second sample
    got = ksa.svr_dot_product_attention(
        *(x.astype("float32") for x in (q, k, v)), is_causal=True,
        mask=valid[:, None, None, :], key_bias=bias.astype("float32"),
        **options,
    )  # fmt: skip
    beta = options.get("beta", 0.0)
    want = np.zeros((2, 7, 4, 4))
    for b in range(2):
        for h in range(4):
            g = h // 2
            factor = options.get("head_factors", [1, 1])[g]
            starts = np.arange(0, 7, factor)
            members = [
                [j for j in range(s, min(s + factor, 7)) if valid[b, j]]
                for s in starts
            ]
            ends = starts + factor - 1  # a window is seen after its span
            kept = [i for i, m in enumerate(members) if m]
            kk = np.stack([k[b, members[w], g].mean(0) for w in kept])
            vv = np.stack([v[b, members[w], g].mean(0) for w in kept])
            aa = np.array([slopes[h] * np.mean(members[w]) for w in kept])
            for i in range(7):
                seen = ends[kept] <= i
                if not valid[b, i] or not seen.any():
                    continue
                mu = kk[seen].mean(0)
                qi = q[b, i, h] - beta * mu
                logits = (kk[seen] - beta * mu) @ qi / 2.0 + aa[seen]
                w = np.exp(logits - logits.max())
                want[b, i, h] = (w / w.sum()) @ vv[seen]
    got = ops.convert_to_numpy(got) * valid[:, :, None, None]
    assert_allclose(got, want)


def test_key_bias_needs_one_row_per_query_head_and_the_softmax_kernel():
    x = np.zeros((1, 3, 4, 2), "float32")
    with pytest.raises(ValueError, match=r"`key_bias` must have shape \(B"):
        ksa.svr_dot_product_attention(x, x, x, key_bias=np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match="`key_bias`.*kernel='linear'"):
        ksa.svr_dot_product_attention(
            x, x, x, kernel="linear", key_bias=np.zeros((1, 4, 3))
        )
