"""Causal decoding from a state for every softmax mode: token by token,
after a prefill and in pieces, the outputs equal one full causal forward;
the state keeps its shapes, and a pooled head keeps about 1 / r of the
slots."""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

import keras_svr_attention as ksa
from keras_svr_attention.convert._cached import CachedSVRAttention
from keras_svr_attention.functional import decoding
from keras_svr_attention.functional.options import svr_options
from tests.testing import BACKEND
from tests.testing import DECODING_LENGTH
from tests.testing import DECODING_SPLITS
from tests.testing import MODES
from tests.testing import assert_allclose
from tests.testing import covering_off_torch
from tests.testing import random_weights
from tests.testing import slow_on_jax
from tests.testing import svr_layer

LENGTH, WIDTH = DECODING_LENGTH, 6
STATE_MODES = {
    **MODES,
    "bn+sh-prefix": {
        "beta": 1.0,
        "head_factors": [2, 3, 1, 2],
        "num_prefix_tokens": 2,
    },
    "sh-window": {"head_factors": [1, 2, 3, 2], "sliding_window": 5},
    "bn-std+sh-window-prefix": {
        "beta": 0.7,
        "standardize": True,
        "head_factors": [1, 2, 3, 2],
        "sliding_window": 6,
        "num_prefix_tokens": 1,
    },
}


def _layer(kind, options, length=LENGTH):
    layer = svr_layer(kind, options)
    x = np.zeros((2, length, WIDTH), "float32")
    layer(x, x)
    random_weights(layer)
    return layer


def _inputs(seed=0, length=LENGTH):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, length, WIDTH)).astype("float32")
    # Row 0 is left-padded (4 tokens, as KerasHub pads prompts), row 1
    # right-padded after 13 tokens.
    at = np.arange(length)[None]
    valid = (at >= np.array([[4], [0]])) & (at < np.array([[length], [13]]))
    return x, valid


def _decode(layer, x, valid, splits, max_length=None):
    """The outputs of `layer` fed `x` in pieces ending at `splits`, and the
    last state."""
    length = x.shape[1]
    state = layer.get_initial_state(2, max_length=max_length or length)
    outputs, start = [], 0
    for end in [*splits, length]:
        piece = x[:, start:end]
        y, state = layer(
            piece,
            piece,
            query_mask=valid[:, start:end],
            value_mask=valid[:, start:end],
            cache=state,
            use_causal_mask=True,
        )
        outputs.append(ops.convert_to_numpy(y))
        start = end
    return np.concatenate(outputs, axis=1), state


def _full(layer, x, valid):
    return layer(x, x, query_mask=valid, value_mask=valid, use_causal_mask=True)


# The modes that reach every line and branch of a decoding step that the
# others reach (measured with coverage.py on torch, with the linear
# state's): unpooled without BN, pooled without BN under a sliding window,
# standardized BN, BN with prefix tokens, standardized BN with a sliding
# window and a prefix token. The others repeat those branches: torch runs
# them by default, TensorFlow and JAX in `nox -s slow`.
COVERING_STATE_MODES = (
    "softmax",
    "sh-window",
    "bn-std+sh",
    "bn+sh-prefix",
    "bn-std+sh-window-prefix",
)


@pytest.mark.parametrize("kind", ["svr", "gqa"])
@pytest.mark.parametrize(
    "mode",
    covering_off_torch(STATE_MODES, COVERING_STATE_MODES),
)
@pytest.mark.parametrize("splits", list(DECODING_SPLITS))
def test_decoding_from_the_state_equals_the_full_causal_forward(
    kind, mode, splits
):
    layer = _layer(kind, STATE_MODES[mode])
    x, valid = _inputs()
    got, state = _decode(layer, x, valid, DECODING_SPLITS[splits])
    # Outputs of order 1 after one layer: float32 rounding, relative 1e-5.
    assert_allclose(got, _full(layer, x, valid), atol=1e-5, rtol=1e-5)
    assert int(ops.convert_to_numpy(state["position"])[0]) == LENGTH


def test_a_state_longer_than_the_sequence_changes_nothing():
    layer = _layer("svr", STATE_MODES["bn+sh-prefix"])
    x, valid = _inputs()
    got, _ = _decode(layer, x, valid, [7], max_length=64)
    assert_allclose(got, _full(layer, x, valid), atol=1e-5, rtol=1e-5)


def test_the_state_keeps_its_shapes_and_pools_its_slots():
    layer = _layer("svr", STATE_MODES["bn-std+sh-window-prefix"])
    x, _ = _inputs()
    state = layer.get_initial_state(2, max_length=LENGTH)
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    for t in range(LENGTH):
        _, state = layer(
            x[:, t : t + 1], x[:, t : t + 1], cache=state, use_causal_mask=True
        )
        assert {name: tuple(s.shape) for name, s in state.items()} == shapes
    # p = 1 prefix token, then windows of r over the other 18 positions,
    # and 2 p spare slots: 1 + 18 / r + 2.
    assert shapes["r1_keys"] == (2, 1, LENGTH, 3)
    assert shapes["r2_keys"] == (2, 2, 1 + 9 + 2, 3)
    assert shapes["r3_values"] == (2, 1, 1 + 6 + 2, 3)


def test_bn_sh_keeps_under_half_of_multi_head_attentions_cache():
    # The heads: 8 of 32, factors 1, 1, 2, 2, 4, 4, 8, 8.
    factors = [1, 1, 2, 2, 4, 4, 8, 8]
    options = svr_options(8, beta=1.0, head_factors=factors)
    length = 16384
    state = decoding.initial_state(options, 1, length, 32, 32, "float32")
    # MultiHeadAttention's cache (B, 2, L, N, D) in float32.
    mha = 2 * length * 8 * 32 * 4
    ratio = decoding.state_bytes(state) / mha
    # Keys and values: (2 + 2 / 2 + 2 / 4 + 2 / 8) / 8 = 0.47, plus the
    # slot flags and the open windows' and BN's sums.
    assert 0.46 < ratio < 0.50


@slow_on_jax
def test_decoding_under_a_compiled_loop_equals_the_full_forward():
    layer = _layer("svr", STATE_MODES["bn+sh-prefix"])
    x, _ = _inputs()
    full = layer(x, x, use_causal_mask=True)
    state = layer.get_initial_state(2, max_length=LENGTH)
    tokens = ops.convert_to_tensor(x)
    outputs = ops.zeros((2, LENGTH, WIDTH))

    def body(t, carry):
        state, outputs = carry
        token = ops.slice(tokens, (0, t, 0), (2, 1, WIDTH))
        y, state = layer(token, token, cache=state, use_causal_mask=True)
        return state, ops.slice_update(outputs, (0, t, 0), y)

    _, outputs = ops.fori_loop(0, LENGTH, body, (state, outputs))
    assert_allclose(outputs, full, 1e-5, 1e-5)


def test_a_functional_decoding_step_compiles_and_equals_the_full_forward():
    layer = _layer("gqa", STATE_MODES["bn-std+sh"])
    x, _ = _inputs()
    full = ops.convert_to_numpy(layer(x, x, use_causal_mask=True))
    state = {
        name: ops.convert_to_numpy(t)
        for name, t in layer.get_initial_state(2, LENGTH).items()
    }
    token = keras.Input((None, WIDTH), batch_size=2, name="token")
    specs = {
        name: keras.Input(t.shape[1:], batch_size=2, dtype=t.dtype, name=name)
        for name, t in state.items()
    }
    y, new = layer(token, token, cache=specs, use_causal_mask=True)
    model = keras.Model({"token": token, **specs}, {"y": y, **new})
    # torch.compile specializes on the position, a new graph per step
    # (seconds each): torch decodes eagerly, as KerasHub's generate does.
    model.compile(jit_compile=BACKEND != "torch")
    ys = []
    for piece in (slice(0, 8), *(slice(t, t + 1) for t in range(8, LENGTH))):
        out = model.predict_on_batch({"token": x[:, piece], **state})
        ys.append(out["y"])
        state = {name: out[name] for name in state}
    assert_allclose(np.concatenate(ys, axis=1), full, 1e-5, 1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_decoding_stays_finite_and_close(dtype):
    layer = svr_layer("svr", STATE_MODES["bn-std+sh"], dtype=dtype)
    x, valid = _inputs()
    layer(x, x)
    random_weights(layer)
    got, _ = _decode(layer, x, valid, [9, 10, 11])
    assert np.all(np.isfinite(got.astype("float32")))
    want = ops.convert_to_numpy(ops.cast(_full(layer, x, valid), "float32"))
    # Half-precision keys and values rounded at each call: a few ulps.
    tolerance = 2e-2 if dtype == "float16" else 1e-1
    assert_allclose(got.astype("float32"), want, tolerance, tolerance)


SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@slow_on_jax
@SETTINGS
@given(
    factors=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    prefix=st.integers(0, 3),
    window=st.one_of(st.none(), st.integers(1, 9)),
    bn=st.sampled_from([None, "beta", "standardize"]),
    cuts=st.lists(st.integers(1, 16), min_size=1, max_size=4, unique=True),
    seed=st.integers(0, 99),
)
def test_any_options_and_any_pieces_decode_as_the_full_forward(
    factors, prefix, window, bn, cuts, seed
):
    options = {
        "head_factors": factors,
        "num_prefix_tokens": prefix,
        "sliding_window": window,
        "beta": None if bn is None else 0.9,
        "standardize": bn == "standardize",
    }
    layer = ksa.SVRAttention(num_heads=len(factors), key_dim=3, **options)
    x, valid = _inputs(seed, length=17)
    layer(x, x)
    random_weights(layer, seed=seed)
    got, _ = _decode(layer, x, valid, sorted(cuts))
    assert_allclose(got, _full(layer, x, valid), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(  # covering (suite, tests/testing.py)
    "mode",
    covering_off_torch(
        ["bn+sh-prefix", "bn-std+sh-window-prefix"],
        ("bn-std+sh-window-prefix",),
    ),
)
def test_the_packed_state_decodes_as_the_state(mode):
    # A causal LM's plumbing (KerasHub's call_with_cache) passes one tensor
    # per layer: the packed state, unpacked and packed again by the layer
    # a converted CachedMultiHeadAttention becomes (it takes no padding:
    # the LM's state holds real tokens only).
    layer = _layer("svr", STATE_MODES[mode])
    packing = CachedSVRAttention.from_config(
        {**layer.get_config(), "decode_with_state": True}
    )
    x, valid = _inputs(seed=3)
    packing(x, x)
    packing.set_weights(layer.get_weights())
    state = packing.get_initial_state(2, max_length=LENGTH + 3, packed=True)
    assert len(state.shape) == 4 and state.shape[1:3] == (1, 1)
    outputs = []
    for t in range(LENGTH):
        piece = x[:, t : t + 1]
        y, state = packing(piece, piece, cache=state)
        outputs.append(ops.convert_to_numpy(y))
    got = np.concatenate(outputs, axis=1)
    full = layer(x, x, use_causal_mask=True)
    assert_allclose(got, full, atol=1e-5, rtol=1e-5)
    # Every entry comes back as it was kept, in its dtype.
    _, kept = _decode(layer, x, valid, [5], max_length=LENGTH + 3)
    back = decoding.unpack_state(
        decoding.pack_state(kept), layer.options, 3, 3, "float32"
    )
    # Padded to a size shared with other layers (a converted Gemma's
    # layers with and without a band), read for the length it was made for.
    packed = decoding.pack_state(kept)
    padded = decoding.pack_state(kept, size=packed.shape[-1] + 7)
    assert padded.shape[-1] == packed.shape[-1] + 7
    padded_back = decoding.unpack_state(
        padded, layer.options, 3, 3, "float32", max_length=LENGTH + 3
    )
    for unpacked in (back, padded_back):
        assert set(unpacked) == set(kept)
        for name, tensor in kept.items():
            assert unpacked[name].dtype == tensor.dtype, name
            np.testing.assert_array_equal(
                ops.convert_to_numpy(unpacked[name]),
                ops.convert_to_numpy(tensor),
            )
    # One number short: no max_length lays that size (an unpooled head
    # adds 2 key_dim + 1 numbers per position).
    with pytest.raises(ValueError, match="packed for another layer"):
        packing(x[:, :1], x[:, :1], cache=state[..., :-1])


def test_what_has_no_state_says_why():
    with pytest.raises(ValueError, match="`max_length`, a positive int"):
        ksa.SVRAttention(num_heads=2, key_dim=3).get_initial_state(1)
    for options, match in (
        ({"sparsity": "local", "block_size": 2}, "sparsity.*cache_update"),
        ({"conv_kernel_size": 3}, "conv_kernel_size"),
    ):
        layer = ksa.SVRAttention(num_heads=2, key_dim=3, **options)
        with pytest.raises(ValueError, match=match):
            layer.get_initial_state(1, max_length=8)
    layer = _layer("gqa", {})
    x = np.zeros((2, 3, WIDTH), "float32")
    with pytest.raises(ValueError, match="`cache` must be a decoding state"):
        layer(x, x, cache=np.zeros((2, 2, 3, 2, 3)), use_causal_mask=True)
    with pytest.raises(ValueError, match="use_causal_mask=True"):
        layer(x, x, cache=layer.get_initial_state(2, max_length=3))


@slow_on_jax
@pytest.mark.parametrize("extra", ["sinks", "alibi"])
@pytest.mark.parametrize("beta", [None, 0.8])
def test_decoding_with_sinks_or_alibi_equals_the_ops_causal_forward(
    beta, extra
):
    # GPT-OSS's learned sinks join each row's denominator; under BN the
    # row term c_i = q'_i^T (b mu_i) joins them (it no longer cancels).
    # ALiBi's bias m_u j is pooled with the keys in the full forward (a
    # window's bias at its mean position), and comes from each slot's
    # window in the state. 4 query heads over 2 key/value heads pooled by
    # 2 and 3 (sinks in a band): after a prefill, token by token and in a
    # piece, as the op's one causal forward.
    rng = np.random.default_rng(5)
    query = rng.normal(size=(2, LENGTH, 4, 3)).astype("float32")
    key, value = (
        rng.normal(size=(2, LENGTH, 2, 3)).astype("float32") for _ in "kv"
    )
    if extra == "sinks":
        window, sinks = 7, rng.normal(size=(4,)).astype("float32")
        in_op, in_state = {"sinks": sinks}, {"sinks": sinks}
    else:
        window, slopes = None, np.array([0.5, 0.25, 0.125, 0.0625], "float32")
        bias = slopes[None, :, None] * np.arange(LENGTH, dtype="float32")
        in_op, in_state = {"key_bias": bias}, {"slopes": slopes}
    factors = [2, 3]
    full = ksa.ops.svr_dot_product_attention(
        query, key, value, is_causal=True, beta=beta, head_factors=factors,
        sliding_window=window, **in_op,
    )  # fmt: skip
    options = svr_options(
        2, beta=beta, head_factors=factors, sliding_window=window
    )
    state = decoding.initial_state(options, 2, LENGTH, 3, 3, "float32")
    # A prefill, tokens one at a time, then a piece.
    outputs, ends = [], [0, 13, 14, 15, 16, LENGTH]
    for start, stop in zip(ends[:-1], ends[1:], strict=True):
        out, state = decoding.decode(
            query[:, start:stop], key[:, start:stop], value[:, start:stop],
            state, options, **in_state,
        )  # fmt: skip
        outputs.append(ops.convert_to_numpy(out))
    assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5, rtol=1e-5)
    # They count: without them the outputs differ.
    state = decoding.initial_state(options, 2, LENGTH, 3, 3, "float32")
    plain, _ = decoding.decode(query, key, value, state, options)
    assert (
        np.abs(ops.convert_to_numpy(plain) - ops.convert_to_numpy(full)).max()
        > 1e-2
    )


def test_alibi_in_a_state_with_prefix_tokens_is_refused():
    options = svr_options(2, num_prefix_tokens=1)
    state = decoding.initial_state(options, 2, LENGTH, 3, 3, "float32")
    query = np.zeros((2, 3, 2, 3), "float32")
    with pytest.raises(ValueError, match="slopes.*prefix tokens"):
        decoding.decode(query, query, query, state, options, slopes=[1, 1])
