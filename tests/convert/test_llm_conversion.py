"""A KerasHub Llama converted to SVR attention: its own rotary embedding,
cache and projections, SVR attention in the hook. Built from a tiny config,
no preset download."""

import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests.testing import assert_allclose
from tests.testing import random_weights

keras_hub = pytest.importorskip("keras_hub")

ATTENTIONS = {
    "bn": {},
    "sh": {"head_factors": [1, 2]},
    "bn+sh": {"head_factors": [2, 1]},
    "linear+bn+sh": {"head_factors": [2, 1]},
}


def _llama(family="llama"):
    config = {
        "vocabulary_size": 40,
        "num_layers": 2,
        "num_query_heads": 4,
        "num_key_value_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    }
    if family == "llama":
        backbone = keras_hub.models.LlamaBackbone(
            max_sequence_length=32, **config
        )
        task = keras_hub.models.LlamaCausalLM
    elif family == "mistral":  # the same hook, a sliding window in its mask
        backbone = keras_hub.models.MistralBackbone(sliding_window=6, **config)
        task = keras_hub.models.MistralCausalLM
    elif family == "qwen":  # the hook takes the cache index
        backbone = keras_hub.models.QwenBackbone(**config)
        task = keras_hub.models.QwenCausalLM
    elif family == "neox":  # no GQA, partial rotary, the hook's dropout
        config["num_heads"] = config.pop("num_query_heads")
        del config["num_key_value_heads"]
        backbone = keras_hub.models.GPTNeoXBackbone(
            max_sequence_length=32, rotary_percentage=0.5, **config
        )
        task = keras_hub.models.GPTNeoXCausalLM
    elif family == "gemma":  # soft-capped logits, a window every other layer
        config["num_query_heads"], config["num_key_value_heads"] = 4, 2
        backbone = keras_hub.models.GemmaBackbone(
            head_dim=4,
            attention_logit_soft_cap=0.5,
            final_logit_soft_cap=30.0,
            use_sliding_window_attention=True,
            sliding_window_size=4,
            query_head_dim_normalize=False,
            **config,
        )
        task = keras_hub.models.GemmaCausalLM
    elif family == "gpt-oss":  # learned sinks, a window j >= i - w
        backbone = keras_hub.models.GptOssBackbone(
            num_experts=2, sliding_window=3, **config
        )
        task = keras_hub.models.GptOssCausalLM
    else:  # Qwen3: QK-norm before the hook, a sliding window in it
        backbone = keras_hub.models.Qwen3Backbone(head_dim=4, **config)
        task = keras_hub.models.Qwen3CausalLM
    random_weights(backbone, seed=1)
    return task(backbone=backbone, preprocessor=None)


def _batch(length=10):
    ids = np.random.default_rng(0).integers(1, 40, (2, length)).astype("int32")
    padding = np.ones((2, length), bool)
    padding[1, 7:] = False  # right padding
    ids[~padding] = 0
    return {"token_ids": ids, "padding_mask": padding}


def _attention_classes(lm):
    names = ("_self_attention_layer", "self_attention_layer", "attention")
    return [
        type(next(getattr(block, n) for n in names if hasattr(block, n)))
        for block in lm.backbone.transformer_layers
    ]


@pytest.mark.parametrize(
    "family", ["llama", "mistral", "qwen", "qwen3", "neox", "gemma", "gpt-oss"]
)
def test_options_off_give_the_original_logits_on_a_padded_batch(family):
    lm = _llama(family)
    x = _batch()
    want = ops.convert_to_numpy(lm(x))
    same = ksa.replace_attention(lm, "softmax")
    assert all(
        cls.__mro__[1].__name__ == "HookedAttention"
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


@pytest.mark.parametrize("attention", list(ATTENTIONS))
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


@pytest.mark.parametrize(
    "family,attention",
    [
        ("llama", "softmax"),
        ("llama", "bn+sh"),
        # The linear kernel in the hook reads Llama's own key/value cache.
        ("llama", "linear+bn+sh"),
        ("mistral", "softmax"),
        # Mistral's sliding window with SH: a cached step's single query
        # cannot tell which keys behind its band earlier queries saw, so
        # windows there average differently (README); BN is exact.
        ("mistral", "bn"),
        ("qwen", "softmax"),
        ("qwen", "bn+sh"),
        ("qwen", "linear+bn+sh"),
        ("qwen3", "bn+sh"),
        ("gemma", "softmax"),
        ("gemma", "bn+sh"),
        ("gpt-oss", "softmax"),
        ("gpt-oss", "bn+sh"),
        # Not GPT-NeoX: KerasHub's own cached step rotates its query as if
        # at position 0, so even the original's generate() differs from
        # teacher forcing.
    ],
)
def test_generate_with_the_cache_equals_teacher_forcing(family, attention):
    # Greedy generation with the cache: one full causal forward over the
    # generated sequence predicts every generated token.
    lm = _llama(family)
    new = ksa.replace_attention(lm, attention, **ATTENTIONS.get(attention, {}))
    prompt = _batch(length=16)
    prompt["padding_mask"][:, 6:] = False
    prompt["padding_mask"][1, 4:] = False
    prompt["token_ids"][~prompt["padding_mask"]] = 0
    new.compile(sampler="greedy")
    out = new.generate(prompt, max_length=16, stop_token_ids=None)
    tokens = ops.convert_to_numpy(out["token_ids"])
    logits = ops.convert_to_numpy(
        new({"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)})
    )
    generated = ~prompt["padding_mask"]
    generated[:, 0] = False
    rows, cols = np.nonzero(generated)
    np.testing.assert_array_equal(
        logits[rows, cols - 1].argmax(-1), tokens[rows, cols]
    )
    assert len(rows) >= 20


def test_converted_llama_survives_keras_save_and_load(tmp_path):
    lm = _llama()
    new = ksa.replace_attention(lm, "bn+sh", head_factors=[1, 2])
    x = _batch()
    want = ops.convert_to_numpy(new(x))
    path = os.path.join(tmp_path, "llama.keras")
    new.save(path)
    loaded = keras.saving.load_model(path)
    for cls in _attention_classes(loaded):
        assert "HookedAttention" in [c.__name__ for c in cls.__mro__]
    for layer in loaded.backbone.transformer_layers:
        options = layer._self_attention_layer._svr_hook_options
        assert options["head_factors"] == [1, 2]
    assert_allclose(loaded(x), want, 1e-5, 1e-5)


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


def test_a_sliding_window_family_refuses_the_linear_kernel_naming_it():
    with pytest.raises(ValueError, match="linear kernel takes no sliding"):
        ksa.replace_attention(_llama("mistral"), "linear")


def test_attention_sinks_refuse_the_linear_kernel_naming_them():
    lm = _llama("gpt-oss")
    for layer in lm._flatten_layers():
        if hasattr(layer, "sinks"):
            layer.sliding_window = None  # the sinks alone
    with pytest.raises(ValueError, match="attention sinks"):
        ksa.replace_attention(lm, "linear")
