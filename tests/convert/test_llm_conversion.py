"""A KerasHub Llama converted to SVR attention: its own rotary embedding,
cache and projections, SVR attention in the hook. Built from a tiny config,
no preset download."""

import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from keras_svr_attention.convert import _llm_hook as hooks
from keras_svr_attention.convert import families
from tests.testing import assert_allclose
from tests.testing import covering_off_torch
from tests.testing import random_weights
from tests.testing import slow_off_torch

keras_hub = pytest.importorskip("keras_hub")

ATTENTIONS = {
    "bn": {},
    "sh": {"head_factors": [1, 2]},
    "bn+sh": {"head_factors": [2, 1]},
    "linear+bn+sh": {"head_factors": [2, 1]},
}


# The families of the conversion table with a tiny model, by name.
_RECORDS = {f.name: f for f in families.FAMILIES.values() if f.example}


def _llama(family="llama"):
    """The family's tiny causal LM (its record's `example`), random
    weights, no preprocessor."""
    example = _RECORDS[family].example
    backbone = getattr(keras_hub.models, example["backbone"])(
        **example["config"]
    )
    random_weights(backbone, seed=1)
    task = getattr(keras_hub.models, example["task"])
    return task(backbone=backbone, preprocessor=None)


def _batch(length=10):
    ids = np.random.default_rng(0).integers(1, 40, (2, length)).astype("int32")
    padding = np.ones((2, length), bool)
    padding[1, 7:] = False  # right padding
    ids[~padding] = 0
    return {"token_ids": ids, "padding_mask": padding}


def _inputs(lm, batch):
    """`batch` as `lm` takes it: with `position_ids` where the backbone
    asks for them (Gemma 4)."""
    if "position_ids" not in lm.backbone.input:
        return batch
    positions = np.cumsum(batch["padding_mask"], axis=1) - 1
    return {**batch, "position_ids": np.maximum(positions, 0).astype("int32")}


def _attention_layers(lm):
    names = (
        "_self_attention_layer", "self_attention_layer", "attention",
        "attention_layer", "self_attention", "self_attn",
    )  # fmt: skip
    return [
        next(getattr(block, n) for n in names if hasattr(block, n))
        for block in lm.backbone.transformer_layers
    ]


def _attention_classes(lm):
    return [type(layer) for layer in _attention_layers(lm)]


FAMILIES = list(_RECORDS)
# Covering (suite, tests/testing.py): Llama, Gemma 3, GPT-OSS, GPT-NeoX,
# Bloom and Falcon; the other families on torch.
OPTIONS_OFF = covering_off_torch(
    FAMILIES, ("llama", "gemma3", "gpt-oss", "neox", "bloom", "falcon")
)


@pytest.mark.parametrize("family", OPTIONS_OFF)
def test_options_off_give_the_original_logits_on_a_padded_batch(family):
    lm = _llama(family)
    x = _inputs(lm, _batch())
    want = ops.convert_to_numpy(lm(x))
    same = ksa.replace_attention(lm, "softmax")
    assert all(
        "HookedAttention" in [c.__name__ for c in cls.__mro__]
        for cls in _attention_classes(same)
    )
    got = ops.convert_to_numpy(same(x))
    valid = x["padding_mask"]
    assert_allclose(got[valid], want[valid], 1e-5, 1e-5)
    # The original is left as it was.
    assert all(
        "HookedAttention" not in [c.__name__ for c in cls.__mro__]
        for cls in _attention_classes(lm)
    )
    assert_allclose(lm(x), want)


@pytest.mark.parametrize(  # covering (suite, tests/testing.py)
    "attention", covering_off_torch(ATTENTIONS, ("bn+sh", "linear+bn+sh"))
)
def test_bn_sh_change_the_logits_and_train(attention):
    lm = _llama()
    x = _batch()
    new = ksa.replace_attention(lm, attention, **ATTENTIONS[attention])
    diff = ops.convert_to_numpy(new(x)) - ops.convert_to_numpy(lm(x))
    assert np.abs(diff).max() > 1e-4
    new.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    y = np.roll(x["token_ids"], -1, axis=1)
    before = [ops.convert_to_numpy(w) for w in new.trainable_weights]
    loss = new.train_on_batch(x, y, sample_weight=x["padding_mask"])
    assert np.all(np.isfinite(loss))
    after = [ops.convert_to_numpy(w) for w in new.trainable_weights]
    assert any(
        np.abs(a - b).max() > 0 for a, b in zip(after, before, strict=True)
    )


# Each family that keeps its key/value cache (Gemma 4), its cached call in
# BN+SH,
# whose head factors [2, 1] give a group of factor 1 too: the family's
# cache, band, scale and bias paths under the fused and the explicit
# kernel (the options-off conversion of every family is exact above). The
# families whose record decodes from a state generate in
# `test_llama_generates_with_its_modes_state_as_teacher_forcing`.
GENERATE_CASES = [
    (name, "bn+sh")
    for name, record in _RECORDS.items()
    if not record.state_call
]


def _generate(lm, family, prompt):
    """Greedy token ids of `lm` from `prompt`, as many as its buffer."""
    if family in ("gemma3", "gemma4"):  # generate() wants a preprocessor
        out = lm.generate_step(
            {k: ops.convert_to_tensor(v) for k, v in prompt.items()},
            stop_token_ids=None,
        )
    else:
        length = prompt["token_ids"].shape[1]
        out = lm.generate(prompt, max_length=length, stop_token_ids=None)
    return ops.convert_to_numpy(out["token_ids"])


def _cache(lm, family, prompt):
    """`lm`'s cache for `prompt`'s buffer, how many numbers it holds, and
    the final hidden states of the prefill that filled it."""
    args = [ops.convert_to_tensor(prompt["token_ids"])]
    if family == "gemma3":  # images, their mask, padding, their indices
        args += [None, None, ops.convert_to_tensor(prompt["padding_mask"])]
        args += [None]
    hidden, cache = lm._build_cache(*args)
    numbers = sum(np.prod(x.shape) for x in keras.tree.flatten(cache))
    return cache, numbers, hidden


@pytest.mark.parametrize("family,attention", GENERATE_CASES)
def test_generate_with_the_cache_equals_teacher_forcing(family, attention):
    # Greedy generation with the cache: one full causal forward over the
    # generated sequence predicts every generated token.
    lm = _llama(family)
    options = ATTENTIONS.get(attention, {})
    new = ksa.replace_attention(lm, attention, **options)
    prompt = _batch(length=16)
    prompt["padding_mask"][:, 6:] = False
    prompt["padding_mask"][1, 4:] = False
    prompt["token_ids"][~prompt["padding_mask"]] = 0
    new.compile(sampler="greedy")
    tokens = _generate(new, family, prompt)
    full = {"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)}
    logits = ops.convert_to_numpy(new(_inputs(new, full)))
    generated = ~prompt["padding_mask"]
    generated[:, 0] = False
    rows, cols = np.nonzero(generated)
    np.testing.assert_array_equal(
        logits[rows, cols - 1].argmax(-1), tokens[rows, cols]
    )
    assert len(rows) >= 20


SAVED = [
    "llama",
    "gemma3",
    "qwen-moe",
    "qwen3-moe",
    "smollm3",
    "bloom",
    "falcon",
]


@pytest.mark.parametrize(  # covering (suite, tests/testing.py)
    "family", covering_off_torch(SAVED, ("llama", "gemma3"))
)
def test_converted_lm_survives_keras_save_and_load_and_trains(family, tmp_path):
    lm = _llama(family)
    new = ksa.replace_attention(lm, "bn+sh", head_factors=[1, 2])
    x = _batch()
    want = ops.convert_to_numpy(new(x))
    path = os.path.join(tmp_path, "lm.keras")
    new.save(path)
    loaded = keras.saving.load_model(path)
    for cls in _attention_classes(loaded):
        assert "HookedAttention" in [c.__name__ for c in cls.__mro__]
    for layer in _attention_layers(loaded):
        assert layer._svr_hook_options["head_factors"] == [1, 2]
    assert_allclose(loaded(x), want, 1e-5, 1e-5)
    loaded.compile("sgd", keras.losses.SparseCategoricalCrossentropy(True))
    y = np.roll(x["token_ids"], -1, axis=1)
    loss = loaded.train_on_batch(x, y, sample_weight=x["padding_mask"])
    assert np.all(np.isfinite(loss))
    assert not np.allclose(ops.convert_to_numpy(loaded(x)), want)


def test_gpt_neox_bn_sh_keeps_its_partial_rotary_and_trains():
    # Per head factors (no GQA: its 4 heads are its key/value heads).
    lm = _llama("neox")
    x = _batch()
    new = ksa.replace_attention(lm, "bn+sh", head_factors=[2, 1, 1, 4])
    diff = ops.convert_to_numpy(new(x)) - ops.convert_to_numpy(lm(x))
    assert np.abs(diff).max() > 1e-4
    new.compile("sgd", keras.losses.SparseCategoricalCrossentropy(True))
    loss = new.train_on_batch(x, np.roll(x["token_ids"], -1, axis=1))
    assert np.all(np.isfinite(loss))


def test_gpt_neox_with_attention_dropout_is_refused_naming_it():
    keras_hub_layers = keras_hub.models.GPTNeoXBackbone(
        vocabulary_size=40,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        dropout=0.1,
    )
    with pytest.raises(ValueError, match="dropout to the attention weights"):
        ksa.replace_attention(keras_hub_layers, "bn")


def test_llama_options_that_need_weights_are_refused():
    with pytest.raises(ValueError, match="LlamaAttention.*learn_beta"):
        ksa.replace_attention(_llama(), "bn", learn_beta=True)
    with pytest.raises(ValueError, match="`head_factors`.*num_key_value"):
        ksa.replace_attention(_llama(), "sh", head_factors=[1, 2, 2, 4])


@pytest.mark.parametrize(
    "family",
    ["mistral", "mixtral", "qwen3", "qwen3-moe", "gemma", "gemma3", "gemma4"],
)
def test_a_sliding_window_family_refuses_the_linear_kernel_naming_it(family):
    with pytest.raises(ValueError, match="sliding_window=.*linear kernel"):
        ksa.replace_attention(_llama(family), "linear")


def test_attention_sinks_refuse_the_linear_kernel_naming_them():
    lm = _llama("gpt-oss")
    for layer in lm._flatten_layers():
        if hasattr(layer, "sinks"):
            layer.sliding_window = None  # the sinks alone
    with pytest.raises(ValueError, match="attention sinks"):
        ksa.replace_attention(lm, "linear")


def test_alibi_refuses_the_linear_kernel_and_attention_dropout_naming_them():
    for family in ("bloom", "falcon"):
        with pytest.raises(ValueError, match="Attention.*ALiBi, a position"):
            ksa.replace_attention(_llama(family), "linear")
    bloom = keras_hub.models.BloomBackbone(
        vocabulary_size=40, num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, dropout=0.1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="dropout to the attention weights"):
        ksa.replace_attention(bloom, "bn")


def test_gemma3_attending_both_ways_is_refused_naming_it():
    # EmbeddingGemma's bidirectional attention, and Gemma 3's image tokens
    # (a vision encoder's prefix that attends both ways): the hook's SVR
    # attention is causal, so both are refused rather than made causal.
    config = {
        "vocabulary_size": 40, "num_layers": 1, "num_query_heads": 2,
        "num_key_value_heads": 1, "hidden_dim": 8, "intermediate_dim": 16,
        "head_dim": 4,
    }  # fmt: skip
    text = keras_hub.models.Gemma3Backbone(
        image_size=None, use_bidirectional_attention=True, **config
    )
    with pytest.raises(ValueError, match="bidirectional attention"):
        ksa.replace_attention(text, "bn")
    vision = keras_hub.models.Gemma3VisionEncoder(
        image_size=8, patch_size=4, num_heads=2, hidden_dim=8, num_layers=1,
        intermediate_dim=16, output_dim=8, pool_size=2,
    )  # fmt: skip
    both = keras_hub.models.Gemma3Backbone(
        image_size=8, vision_encoder=vision, **config
    )
    with pytest.raises(ValueError, match="image tokens.*both ways"):
        ksa.replace_attention(both, "bn", skip_unsupported=False)
    pali = keras_hub.models.PaliGemmaBackbone(
        image_size=16, vit_patch_size=4, vit_num_heads=2, vit_hidden_dim=8,
        vit_num_layers=1, **{**config, "num_query_heads": 2},
    )  # fmt: skip
    with pytest.raises(ValueError, match="CachedGemmaAttention.*both ways"):
        ksa.replace_attention(pali, "bn", skip_unsupported=True)


def test_qk_norm_comes_before_bn_recentering():
    # Qwen3's QK-norm and rotary embedding give the keys the hook sees; BN
    # recenters those, written plainly here: h_i = sum_j softmax_j((q_i -
    # b mu_i)^T k_j / sqrt(D)) v_j, mu_i the mean of the normed, rotated
    # keys 0..i of the query's key/value head.
    lm = _llama("qwen3")
    layer = _attention_layers(ksa.replace_attention(lm, "bn", beta=0.7))[0]
    x = keras.random.normal((2, 6, 16), seed=3)
    rope = layer.rotary_embedding_layer
    q = rope(layer._query_dense_layer_norm(layer._query_dense(x)))
    k = rope(layer._key_dense_layer_norm(layer._key_dense(x)))
    q, k, v = (ops.convert_to_numpy(t) for t in (q, k, layer._value_dense(x)))
    k, v = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)  # 2 groups
    mu = np.cumsum(k, axis=1) / np.arange(1, 7)[None, :, None, None]
    logits = np.einsum("btnd,bsnd->bnts", q - 0.7 * mu, k) / 2.0  # D = 4
    logits = np.where(np.tril(np.ones((6, 6), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    heads = np.einsum(
        "bnts,bsnd->btnd", weights / weights.sum(-1, keepdims=True), v
    )
    want = layer._output_dense(heads.astype("float32"))
    mask = np.tril(np.ones((2, 6, 6), "int32"))
    assert_allclose(layer(x, attention_mask=mask), want, 1e-5, 1e-5)


@pytest.mark.parametrize(
    "family",
    [
        "llama",
        pytest.param("bloom", marks=slow_off_torch),
        pytest.param("gemma3", marks=slow_off_torch),
    ],
)
def test_lora_and_int8_reach_the_same_sublayers_after_conversion(family):
    # The family's projections keep their names and weight order, so
    # KerasHub's `enable_lora` targets and Keras's `quantize` find the same
    # layers; LoRA starts at zero, so the outputs do not move.
    lm = _llama(family)
    new = ksa.replace_attention(lm, "bn+sh", head_factors=[1, 2])
    x = _batch()
    want = ops.convert_to_numpy(new(x))
    adapted = []
    for model in (lm, new):
        model.backbone.enable_lora(rank=2)
        adapted.append(
            sorted(w.path for w in model.trainable_weights if "lora" in w.path)
        )
    assert adapted[0] and adapted[0] == adapted[1]
    with pytest.raises(ValueError, match="Convert first, then enable LoRA"):
        ksa.replace_attention(lm, "bn")  # LoRA enabled before conversion
    assert_allclose(new(x), want, 1e-5, 1e-5)
    quantized = ksa.replace_attention(
        _llama(family), "bn+sh", head_factors=[1, 2]
    )
    quantized(x)  # built (Bloom builds its AlibiBias on the first call)
    quantized.quantize("int8")
    kinds = {
        type(layer).__name__
        for layer in _attention_layers(quantized)[0]._flatten_layers()
        if getattr(layer, "quantization_mode", None) == "int8"
    }
    assert kinds, "no projection of the attention was quantized"
    got = ops.convert_to_numpy(quantized(x))
    assert np.all(np.isfinite(got))
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()


def _repeat(family, attention, options):
    """A state row whose state class and mode a row above runs on every
    backend, with Python-level logic of its own (a family's QK-norm, band,
    experts, Gemma 3's tuple of caches, Falcon's slopes) that each backend
    computes with the same ops: torch runs it by default, TensorFlow and
    JAX in `nox -s slow` (`slow_off_torch`)."""
    return pytest.param(family, attention, options, marks=slow_off_torch)


@pytest.mark.parametrize(
    "family,attention,options",
    [
        ("llama", "softmax", {}),
        ("llama", "bn+sh", {"head_factors": [2, 4]}),
        # The linear kernel: the recurrent state, per query head.
        ("llama", "linear+bn+sh", {"head_factors": [2, 4]}),
        # The other families whose record has `state_call`: QK-norm
        # (Qwen3), experts, and bands (Mistral's in its mask, Qwen3's in
        # its hook) that the state applies.
        _repeat("qwen", "bn+sh", {"head_factors": [1, 4]}),
        _repeat("qwen", "linear+bn+sh", {"head_factors": [2, 1]}),
        _repeat("qwen-moe", "bn+sh", {"head_factors": [4, 2]}),
        _repeat("qwen3", "bn+sh", {"head_factors": [2, 1]}),
        ("qwen3-moe", "sh", {"head_factors": [2, 4]}),
        _repeat("mistral", "bn+sh", {"head_factors": [1, 2]}),
        _repeat("mixtral", "bn+sh", {"head_factors": [4, 2]}),
        _repeat("phi3", "bn+sh", {"head_factors": [2, 4]}),
        _repeat("phi3", "linear+bn+sh", {"head_factors": [4, 2]}),
        # SmolLM3: its own names and rotary, a NoPE layer.
        ("smollm3", "bn+sh", {"head_factors": [2, 4]}),
        _repeat("smollm3", "linear+bn+sh", {"head_factors": [4, 2]}),
        # Gemma: its rotary layout, soft-capped logits, a band every
        # other layer.
        ("gemma", "bn+sh", {"head_factors": [2, 1]}),
        _repeat("gemma", "softmax", {}),
        # Gemma 3: QK-norm, a tuple of layer caches, 5 local : 1 global.
        _repeat("gemma3", "bn+sh", {"head_factors": [2, 4]}),
        # GPT-OSS: sinks (under BN with the row term), its band.
        ("gpt-oss", "bn+sh", {"head_factors": [1, 2]}),
        _repeat("gpt-oss", "softmax", {}),
        # Bloom and Falcon: ALiBi on each slot at its window's mean.
        ("bloom", "bn+sh", {"head_factors": [2, 1]}),
        _repeat("falcon", "bn+sh", {"head_factors": [1, 2]}),
        _repeat("falcon", "softmax", {}),
        # GPT-NeoX: its fused projection and partial rotary, no GQA.
        ("neox", "bn+sh", {"head_factors": [2, 1, 1, 4]}),
        _repeat("neox", "linear+bn+sh", {"head_factors": [4, 2, 2, 4]}),
    ],
)
def test_llama_generates_with_its_modes_state_as_teacher_forcing(
    family, attention, options, tmp_path
):
    # Llama's attention takes over its call to decode from the state: its
    # cache is the stacked packed states, per key/value head (GQA) and
    # pooled by SH; greedy generate() equals one full causal forward, also
    # after .keras save and load.
    lm = _llama(family)
    new = ksa.replace_attention(lm, attention, **options)
    assert all(
        isinstance(layer, hooks.RotaryState) for layer in _attention_layers(new)
    )
    prompt = _batch(length=24)
    prompt["padding_mask"][:, 7:] = False
    prompt["padding_mask"][1, 5:] = False
    prompt["token_ids"][~prompt["padding_mask"]] = 0
    new.compile(sampler="greedy")
    path = os.path.join(tmp_path, "lm.keras")
    new.save(path)
    for model in (new, keras.saving.load_model(path)):
        model.compile(sampler="greedy")
        tokens = _generate(model, family, prompt)
        logits = ops.convert_to_numpy(
            model({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})
        )
        generated = ~prompt["padding_mask"]
        rows, cols = np.nonzero(generated)
        np.testing.assert_array_equal(
            logits[rows, cols - 1].argmax(-1), tokens[rows, cols]
        )
    # The prefill through the state: the full forward's hidden states,
    # not only their argmax (ALiBi's slopes, sinks and soft caps move
    # logits a little).
    full = {"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)}
    hidden = _cache(new, family, full)[2]
    assert_allclose(hidden, new.backbone(full), atol=1e-4, rtol=1e-4)
    cache, numbers, _ = _cache(new, family, prompt)
    ratio = numbers / _cache(lm, family, prompt)[1]
    if attention == "softmax":  # the keys and values, slot flags, positions
        assert tuple(cache.shape[2:4]) == (1, 1) and 1 < ratio < 1.1
    else:  # per head the pooled slots and two slots' worth more (the
        # open window's sums, BN's), each at most 2 D + 2 numbers (keys,
        # values, flag, first position under a band) where the key/value
        # cache holds 2 D a position
        pooled = np.mean([1 / f for f in options["head_factors"]])
        dim = _attention_layers(new)[0]._svr_head_dim()
        length = prompt["token_ids"].shape[1]
        assert ratio < (pooled + 2 / length) * (1 + 1 / dim)
