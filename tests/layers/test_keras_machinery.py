"""SVRAttention on Keras's own machinery: quantization, LoRA, gates, sliding
windows, rank-2 masks, flash attention, constraints and regularizers (mixed
precision against float32: tests/layers/test_layer_battery.py).

Every mode goes through the projection sublayers' `call`, so whatever Keras
does to an `EinsumDense` reaches every head group.
"""

import gc

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from keras_svr_attention.layers import _validation
from tests.testing import BACKEND
from tests.testing import MODES
from tests.testing import B
from tests.testing import D
from tests.testing import N
from tests.testing import S
from tests.testing import T
from tests.testing import assert_allclose
from tests.testing import covering_off_torch
from tests.testing import make_inputs
from tests.testing import random_weights
from tests.testing import reference

KERNEL_MODES = [(m, "softmax") for m in MODES] + [
    (m, "linear") for m in ("softmax", "bn", "sh", "bn+sh")
]
KERNEL_IDS = [f"{m}-{k}" for m, k in KERNEL_MODES]
# Quantization and LoRA reach the projections whatever the attention:
# BN+SH (plain and standardized) and linear BN+SH cover (suite,
# tests/testing.py).
PROJECTION_MODES = covering_off_torch(
    KERNEL_MODES,
    [("bn+sh", "softmax"), ("bn-std+sh", "softmax"), ("bn+sh", "linear")],
    ids=KERNEL_IDS,
)


def _numpy(x):
    return np.asarray(ops.convert_to_numpy(x), "float64")


def _relative_rms(actual, desired):
    actual, desired = _numpy(actual), _numpy(desired)
    return np.sqrt(np.mean((actual - desired) ** 2) / np.mean(desired**2))


def _attention_model(layer, query, value, key):
    """A functional model around `layer` (Model.quantize works on models)."""
    inputs = [keras.Input(x.shape[1:]) for x in (query, value, key)]
    model = keras.Model(inputs, layer(*inputs))
    return model


def _quantization_modes():
    """The post-training modes of this Keras that need no calibration data
    (float8 is trained; gptq and awq calibrate on a dataset)."""
    from keras.src import dtype_policies

    supported = getattr(dtype_policies, "QUANTIZATION_MODES", ("int8",))
    return [mode for mode in ("int8", "int4") if mode in supported]


@pytest.mark.parametrize("quantization", _quantization_modes())
@pytest.mark.parametrize("mode,kernel", PROJECTION_MODES)
def test_quantized_layer_stays_as_close_as_mha(
    mode, kernel, quantization, monkeypatch
):
    # Keras frees each float kernel with gc.collect(), 0.2 s apiece in a
    # long test process; memory does not matter here.
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    # 64-wide inputs so that int8 per-channel scales behave as in practice.
    rng = np.random.default_rng(0)
    query = rng.normal(size=(B, 16, 64)).astype("float32")
    value = rng.normal(size=(B, 20, 64)).astype("float32")
    key = rng.normal(size=(B, 20, 64)).astype("float32")
    errors = {}
    for name, layer in (
        ("mha", keras.layers.MultiHeadAttention(num_heads=4, key_dim=16)),
        (
            "svr",
            ksa.SVRAttention(
                num_heads=4, key_dim=16, kernel=kernel, **MODES[mode]
            ),
        ),
    ):
        model = _attention_model(layer, query, value, key)
        random_weights(layer, seed=1)
        want = model([query, value, key])
        model.quantize(quantization)
        assert layer.query_dense.quantization_mode == quantization
        got = model([query, value, key])
        errors[name] = _relative_rms(got, want)
    # The quantized SVR layer is as close to its own float output as MHA is
    # to its own, within a factor 2 (different attention, same projections).
    assert errors["svr"] < 2 * errors["mha"] + 1e-3, errors
    assert errors["svr"] > 0, "quantization did not reach the projections"


@pytest.mark.parametrize("mode,kernel", PROJECTION_MODES)
def test_lora_reaches_every_projection(mode, kernel):
    # LoRA on each projection alone: the output changes, and equals a copy
    # whose kernel has the LoRA update merged in (`dense.kernel`), so no
    # projection is bypassed.
    query, value, key = make_inputs()
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        layers = [
            ksa.SVRAttention(
                num_heads=N, key_dim=D, kernel=kernel, **MODES[mode]
            )
            for _ in range(2)
        ]
        svr, merged = layers
        for layer in layers:
            layer(query, value, key)
        random_weights(svr)
        merged.set_weights(svr.get_weights())
        before = svr(query, value, key)
        dense = getattr(svr, name)
        dense.enable_lora(2)
        dense.lora_kernel_b.assign(
            np.full(dense.lora_kernel_b.shape, 0.5, "float32")
        )
        getattr(merged, name).kernel.assign(dense.kernel)
        after = svr(query, value, key)
        assert _relative_rms(after, before) > 1e-4, f"{name}: no change"
        assert_allclose(after, merged(query, value, key), 1e-4, 1e-4)


def test_lora_layer_equals_mha_with_lora_when_options_off():
    query, value, key = make_inputs()
    mha = keras.layers.MultiHeadAttention(num_heads=N, key_dim=D)
    svr = ksa.SVRAttention(num_heads=N, key_dim=D)
    for layer in (mha, svr):
        layer(query, value, key)
        layer.query_dense.enable_lora(2)
        layer.value_dense.enable_lora(3)
    random_weights(mha)
    svr.set_weights(mha.get_weights())
    assert_allclose(svr(query, value, key), mha(query, value, key))


@pytest.mark.parametrize("mode", list(MODES))
def test_rank2_attention_mask_broadcasts_as_rank3(mode):
    query, value, key = make_inputs()
    rng = np.random.default_rng(3)
    mask = rng.random((T, S)) < 0.7
    layer = ksa.SVRAttention(num_heads=N, key_dim=D, **MODES[mode])
    layer(query, value, key)
    random_weights(layer)
    got = layer(query, value, key, attention_mask=mask)
    want, _ = reference(layer, mode, query, value, key, mask[None], None, False)
    assert_allclose(got, want)
    assert_allclose(
        got, layer(query, value, key, attention_mask=np.stack([mask] * B))
    )


def test_rank2_mask_equals_mha():
    query, value, key = make_inputs()
    mask = np.tril(np.ones((T, S), bool), 1)
    mha = keras.layers.MultiHeadAttention(num_heads=N, key_dim=D)
    svr = ksa.SVRAttention(num_heads=N, key_dim=D)
    mha(query, value, key)
    svr(query, value, key)
    random_weights(mha)
    svr.set_weights(mha.get_weights())
    assert_allclose(
        svr(query, value, key, attention_mask=mask),
        mha(query, value, key, attention_mask=mask),
    )


needs_gate = pytest.mark.skipif(
    not _validation.keras_supports("use_gate"),
    reason="use_gate needs Keras >= 3.14",
)
needs_window = pytest.mark.skipif(
    not _validation.keras_supports("sliding_window"),
    reason="MultiHeadAttention(sliding_window=...) needs Keras >= 3.15",
)


@needs_gate
def test_gate_equals_mha_when_options_off():
    query, value, key = make_inputs()
    mha = keras.layers.MultiHeadAttention(num_heads=N, key_dim=D, use_gate=True)
    svr = ksa.SVRAttention(num_heads=N, key_dim=D, use_gate=True)
    mha(query, value, key)
    svr(query, value, key)
    random_weights(mha)
    assert len(svr.weights) == len(mha.weights)
    svr.set_weights(mha.get_weights())
    for causal in (False, True):
        assert_allclose(
            svr(query, value, key, use_causal_mask=causal),
            mha(query, value, key, use_causal_mask=causal),
        )


@needs_gate
@pytest.mark.parametrize("mode,kernel", KERNEL_MODES, ids=KERNEL_IDS)
def test_gate_multiplies_every_head_before_output_dense(mode, kernel):
    # gate = sigmoid(x W_g + b_g): a gate of exactly 1 (huge bias) gives the
    # ungated layer; a gate of 0.5 everywhere (zero kernel and bias) halves
    # the attention output before output_dense.
    query, value, key = make_inputs()
    options = dict(num_heads=N, key_dim=D, kernel=kernel, **MODES[mode])
    plain = ksa.SVRAttention(**options)
    gated = ksa.SVRAttention(use_gate=True, **options)
    plain(query, value, key)
    gated(query, value, key)
    random_weights(plain)
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        getattr(gated, name).set_weights(getattr(plain, name).get_weights())
    gate = gated._gate_dense
    gate.kernel.assign(np.zeros(gate.kernel.shape, "float32"))
    gate.bias.assign(np.full(gate.bias.shape, 40.0, "float32"))
    want = plain(query, value, key, use_causal_mask=True)
    assert_allclose(gated(query, value, key, use_causal_mask=True), want)
    gate.bias.assign(np.zeros(gate.bias.shape, "float32"))
    bias = _numpy(plain.output_dense.bias)
    half = _numpy(gated(query, value, key, use_causal_mask=True)) - bias
    assert_allclose(half, (_numpy(want) - bias) / 2)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sliding_window_matches_reference(mode, causal):
    query, value, _ = make_inputs(num_keys=T, self_attention=True)
    window = 3
    layer = ksa.SVRAttention(
        num_heads=N, key_dim=D, sliding_window=window, **MODES[mode]
    )
    layer(query, value)
    random_weights(layer)
    band = np.abs(np.arange(T)[:, None] - np.arange(T)[None]) < window
    got, scores = layer(
        query, value, use_causal_mask=causal, return_attention_scores=True
    )
    want, want_scores = reference(
        layer, mode, query, value, None, band[None], None, causal
    )
    tol = 5e-5 if MODES[mode].get("standardize") else 1e-5
    assert_allclose(got, want, tol, tol)
    assert_allclose(scores, want_scores, tol, tol)


@needs_window
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sliding_window_equals_mha(causal):
    query, value, _ = make_inputs(self_attention=True)
    mha = keras.layers.MultiHeadAttention(
        num_heads=N, key_dim=D, sliding_window=2
    )
    svr = ksa.SVRAttention(num_heads=N, key_dim=D, sliding_window=2)
    mha(query, value)
    svr(query, value)
    random_weights(mha)
    svr.set_weights(mha.get_weights())
    assert_allclose(
        svr(query, value, use_causal_mask=causal),
        mha(query, value, use_causal_mask=causal),
    )


def test_new_arguments_round_trip_through_config():
    layer = ksa.SVRAttention(
        num_heads=N,
        key_dim=D,
        sliding_window=4,
        use_gate=_validation.keras_supports("use_gate"),
        beta=np.float32(0.5),
        head_factors=np.array([1, 1, 2, 2]),
        num_prefix_tokens=np.int64(1),
    )
    config = layer.get_config()
    clone = ksa.SVRAttention.from_config(config)
    assert clone.get_config() == config
    assert config["sliding_window"] == 4
    assert type(config["beta"]) is float
    assert config["head_factors"] == [1, 1, 2, 2]
    assert type(config["num_prefix_tokens"]) is int


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow only")
def test_flash_attention_refused_on_tensorflow():
    with pytest.raises(ValueError, match="`flash_attention=True`.*TensorFlow"):
        ksa.SVRAttention(num_heads=2, key_dim=4, flash_attention=True)


@pytest.mark.skipif(BACKEND == "tensorflow", reason="no fused kernel on TF")
def test_flash_attention_refuses_what_mha_refuses():
    with pytest.raises(ValueError, match="`kernel='linear'`|kernel='linear'"):
        ksa.SVRAttention(
            num_heads=2, key_dim=4, flash_attention=True, kernel="linear"
        )
    with pytest.raises(ValueError, match="`dropout`"):
        ksa.SVRAttention(
            num_heads=2, key_dim=4, flash_attention=True, dropout=0.1
        )
    layer = ksa.SVRAttention(num_heads=2, key_dim=4, flash_attention=True)
    x = np.zeros((1, 3, 8), "float32")
    with pytest.raises(ValueError, match="`return_attention_scores=True`"):
        layer(x, x, return_attention_scores=True)


def test_flash_attention_false_reaches_the_kernel(monkeypatch):
    # flash_attention=False, kept through a config round trip, is what the
    # fused op receives; the numbers equal the default's.
    seen = []
    fused = keras.ops.dot_product_attention

    def recording(*args, **kwargs):
        seen.append(kwargs.get("flash_attention"))
        return fused(*args, **kwargs)

    monkeypatch.setattr(keras.ops, "dot_product_attention", recording)
    query, value, key = make_inputs()
    layer = ksa.SVRAttention(num_heads=N, key_dim=D, flash_attention=False)
    layer = ksa.SVRAttention.from_config(layer.get_config())
    plain = ksa.SVRAttention(num_heads=N, key_dim=D)
    layer(query, value, key)
    plain(query, value, key)
    plain.set_weights(layer.get_weights())
    seen.clear()
    got = layer(query, value, key)
    if keras.config.backend() != "tensorflow" or N > 1:
        assert seen and all(flag is False for flag in seen), seen
    assert_allclose(got, plain(query, value, key))


def test_constraints_and_regularizers_reach_every_projection():
    query, value, key = make_inputs()
    layer = ksa.SVRAttention(
        num_heads=N,
        key_dim=D,
        head_factors=[1, 2, 2, 4],
        kernel_regularizer="l2",
        kernel_constraint=keras.constraints.MaxNorm(0.1),
    )
    layer(query, value, key)
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense):
        assert isinstance(dense.kernel_constraint, keras.constraints.MaxNorm)
    assert len(layer.losses) == 4  # one l2 term per projection kernel


@pytest.mark.skipif(BACKEND != "jax", reason="reads the traced JAX program")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_options_off_traces_the_same_program_as_mha(causal):
    # With every option off the layer adds nothing to MultiHeadAttention's
    # computation: the traced training step has the same operations.
    import jax

    x = np.random.default_rng(0).normal(size=(2, 16, 8)).astype("float32")

    def program(layer):
        layer(x, x)
        trainable = [v.value for v in layer.trainable_variables]
        frozen = [v.value for v in layer.non_trainable_variables]

        def loss(trainable):
            out, _ = layer.stateless_call(
                trainable, frozen, x, x, use_causal_mask=causal
            )
            return out.sum()

        jaxpr = jax.make_jaxpr(jax.grad(loss))(trainable)
        return [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]

    mha = program(keras.layers.MultiHeadAttention(num_heads=2, key_dim=4))
    svr = program(ksa.SVRAttention(num_heads=2, key_dim=4))
    assert svr == mha
