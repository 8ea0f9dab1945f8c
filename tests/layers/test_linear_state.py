"""Causal linear attention as a recurrence: the chunked form and the
constant-size decoding state against the full causal forward."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from keras_svr_attention.functional import kernels
from keras_svr_attention.functional import recurrent
from keras_svr_attention.functional.options import svr_options
from tests.testing import DECODING_LENGTH
from tests.testing import DECODING_SPLITS
from tests.testing import MODES
from tests.testing import assert_allclose
from tests.testing import covering_off_torch
from tests.testing import random_weights
from tests.testing import value_and_grad

STATE_MODES = {
    **{f"linear-{name}": options for name, options in MODES.items()},
    "linear-bn+sh-prefix": {
        "beta": 1.0,
        "head_factors": [2, 3, 1, 2],
        "num_prefix_tokens": 2,
    },
}
LENGTH, WIDTH = DECODING_LENGTH, 6


def _layer(options, **kwargs):
    layer = ksa.SVRAttention(
        num_heads=4, key_dim=3, kernel="linear", **options, **kwargs
    )
    x = np.zeros((2, LENGTH, WIDTH), "float32")
    layer(x, x)
    random_weights(layer)
    return layer


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, LENGTH, WIDTH)).astype("float32")
    # Row 1 is right-padded after 13 tokens.
    valid = np.arange(LENGTH)[None] < np.array([[LENGTH], [13]])
    return x, valid


def _decode(layer, x, valid, splits):
    """The outputs of `layer` fed `x` in pieces ending at `splits`, from
    the initial state, and the last state."""
    state = layer.get_initial_state(2)
    outputs, start = [], 0
    for end in [*splits, LENGTH]:
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


# The modes that reach every line and branch of a linear decoding step
# that the others reach (coverage.py on torch): without BN, pooled without
# BN, standardized BN with pooled heads, BN with prefix tokens. The others
# repeat those branches: torch runs them by default, TensorFlow and JAX in
# `nox -s slow`.
COVERING_STATE_MODES = (
    "linear-softmax",
    "linear-sh",
    "linear-bn-std+sh",
    "linear-bn+sh-prefix",
)


@pytest.mark.parametrize(
    "mode",
    covering_off_torch(STATE_MODES, COVERING_STATE_MODES),
)
@pytest.mark.parametrize("splits", list(DECODING_SPLITS))
def test_decoding_from_the_state_equals_the_full_causal_forward(mode, splits):
    layer = _layer(STATE_MODES[mode])
    x, valid = _inputs()
    full = layer(x, x, query_mask=valid, value_mask=valid, use_causal_mask=True)
    got, state = _decode(layer, x, valid, DECODING_SPLITS[splits])
    # Outputs of order 1 after one layer: float32 rounding, relative 1e-5.
    assert_allclose(got, full, atol=1e-5, rtol=1e-5)
    assert int(ops.convert_to_numpy(state["position"])[0]) == LENGTH


def test_the_state_does_not_grow_with_the_tokens_seen():
    layer = _layer(STATE_MODES["linear-bn-std+sh"])
    x, valid = _inputs()
    state = layer.get_initial_state(2)
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    for t in range(LENGTH):
        _, state = layer(
            x[:, t : t + 1], x[:, t : t + 1], cache=state, use_causal_mask=True
        )
        assert {name: tuple(s.shape) for name, s in state.items()} == shapes
    assert shapes["kv"] == (2, 4, 3, 3)


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_chunked_causal_kernel_equals_the_dense_formula(chunk_size):
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.normal(size=(2, 11, 3, 4)).astype("float32") for _ in range(3)
    )
    kv0 = rng.uniform(size=(2, 3, 4, 4)).astype("float32")
    z0 = rng.uniform(1, 2, size=(2, 3, 4)).astype("float32")
    num, den, (kv, z) = kernels.causal_linear_attention(
        q, k, v, (kv0, z0), chunk_size
    )
    # S_i = S_0 + sum_{j <= i} k_j v_j^T, written plainly.
    lower = np.tril(np.ones((11, 11)))
    want_num = np.einsum("btnd,bnde->btne", q, kv0) + np.einsum(
        "ts,btnd,bsnd,bsne->btne", lower, q, k, v
    )
    want_den = np.einsum("btnd,bnd->btn", q, z0) + np.einsum(
        "ts,btnd,bsnd->btn", lower, q, k
    )
    assert_allclose(num, want_num, 1e-5, 1e-5)
    assert_allclose(den, want_den, 1e-5, 1e-5)
    assert_allclose(kv, kv0 + np.einsum("bsnd,bsne->bnde", k, v), 1e-5, 1e-5)
    assert_allclose(z, z0 + k.sum(1), 1e-5, 1e-5)


@pytest.mark.parametrize(  # covering (suite, tests/testing.py)
    "mode",
    covering_off_torch(
        ["linear-softmax", "linear-bn-std+sh"], ("linear-softmax",)
    ),
)
def test_chunk_size_changes_neither_outputs_nor_gradients(mode):
    x, valid = _inputs(seed=2)
    results = []
    for chunk_size in (1, 5, 64):
        layer = _layer(STATE_MODES[mode], chunk_size=chunk_size)

        def loss(x, layer=layer):
            y = layer(x, x, value_mask=valid, use_causal_mask=True)
            return ops.sum(ops.square(y))

        results.append(
            [ops.convert_to_numpy(t) for t in value_and_grad(loss, x)]
        )
    for value, grad in results[1:]:
        assert_allclose(value, results[0][0], 1e-5, 1e-5)
        assert_allclose(grad, results[0][1], 1e-5, 1e-5)


def test_decoding_under_ops_scan_equals_the_full_forward():
    layer = _layer(STATE_MODES["linear-bn+sh"])
    x, _ = _inputs()
    full = layer(x, x, use_causal_mask=True)

    # The output rides in the carry: TensorFlow's scan stacks outputs
    # shaped like the carry.
    def step(carry, x_t):
        y, state = layer(
            x_t[:, None], x_t[:, None], cache=carry[0], use_causal_mask=True
        )
        return (state, y[:, 0]), (state, y[:, 0])

    tokens = ops.transpose(ops.convert_to_tensor(x), (1, 0, 2))
    init = (layer.get_initial_state(2), ops.zeros((2, WIDTH)))
    _, (_, ys) = ops.scan(step, init, tokens)
    assert_allclose(ops.transpose(ys, (1, 0, 2)), full, 1e-5, 1e-5)


def test_a_functional_decoding_step_compiles_and_equals_the_full_forward():
    layer = _layer(STATE_MODES["linear-bn-std+sh"])
    x, _ = _inputs()
    full = ops.convert_to_numpy(layer(x, x, use_causal_mask=True))
    state = {
        name: ops.convert_to_numpy(t)
        for name, t in layer.get_initial_state(2).items()
    }
    token = keras.Input((None, WIDTH), batch_size=2, name="token")
    specs = {
        name: keras.Input(t.shape[1:], batch_size=2, dtype=t.dtype, name=name)
        for name, t in state.items()
    }
    y, new = layer(token, token, cache=specs, use_causal_mask=True)
    model = keras.Model({"token": token, **specs}, {"y": y, **new})
    model.compile(jit_compile=True)
    ys = []
    for t in range(LENGTH):
        out = model.predict_on_batch({"token": x[:, t : t + 1], **state})
        ys.append(out["y"])
        state = {name: out[name] for name in state}
    assert_allclose(np.concatenate(ys, axis=1), full, 1e-5, 1e-5)


def test_conv_has_no_state_and_says_why():
    conv = ksa.SVRAttention(
        num_heads=2, key_dim=3, kernel="linear", conv_kernel_size=3
    )
    with pytest.raises(ValueError, match="conv_kernel_size"):
        conv.get_initial_state(1)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"use_causal_mask": False}, "use_causal_mask=True"),
        ({"cache_update_index": 0}, "cache_update_index"),
        ({"attention_mask": np.ones((2, 3, 3), bool)}, "attention_mask"),
        ({"return_attention_scores": True}, "return_attention_scores"),
    ],
)
def test_a_state_call_refuses_what_it_cannot_honour(kwargs, match):
    layer = _layer({})
    x = np.zeros((2, 3, WIDTH), "float32")
    kwargs = {"use_causal_mask": True, **kwargs}
    with pytest.raises(ValueError, match=match):
        layer(x, x, cache=layer.get_initial_state(2), **kwargs)


@pytest.mark.parametrize("mode", ["linear-softmax", "linear-bn+sh-prefix"])
def test_a_prefill_with_a_limit_lets_only_earlier_tokens_in(mode):
    # KerasHub prefills a padded buffer, then resumes at the shortest
    # prompt: only the tokens before that point may enter the state.
    options = svr_options(4, **STATE_MODES[mode], kernel="linear")
    rng = np.random.default_rng(3)
    q, k, v = (
        ops.convert_to_tensor(rng.normal(size=(2, LENGTH, 4, 3)), "float32")
        for _ in range(3)
    )
    empty = recurrent.initial_state(options, 2, 3, 3)
    whole, _ = recurrent.linear_recurrence(q, k, v, empty, options)
    _, state = recurrent.linear_recurrence(q, k, v, empty, options, limit=11)
    assert int(ops.convert_to_numpy(state["position"])[0]) == 11
    rest, _ = recurrent.linear_recurrence(
        q[:, 11:], k[:, 11:], v[:, 11:], state, options
    )
    assert_allclose(rest, ops.convert_to_numpy(whole)[:, 11:], 1e-5, 1e-5)


def test_the_packed_state_holds_every_entry():
    options = svr_options(
        4, beta=1.0, standardize=True, head_factors=[1, 2, 2, 4]
    )
    rng = np.random.default_rng(4)
    state = {
        name: ops.convert_to_tensor(
            rng.integers(0, 99, size=t.shape)
            if name == "position"
            else rng.normal(size=t.shape),
            t.dtype,
        )
        for name, t in recurrent.initial_state(options, 2, 3, 3).items()
    }
    packed = recurrent.pack_state(state)
    # S as 3 rows, 9 more entries, one pad row: (2, 2, 6, heads, key_dim).
    assert tuple(packed.shape) == (2, 2, 6, 4, 3)
    back = recurrent.unpack_state(packed, options, 3)
    assert sorted(back) == sorted(state)
    for name, tensor in state.items():
        np.testing.assert_array_equal(
            ops.convert_to_numpy(back[name]), ops.convert_to_numpy(tensor)
        )
