"""The KerasHub attention classes conversion knows, one record each.

A decoder LLM's attention layer becomes SVR attention through its hook
(`_llm_hook.HookedAttention`) or, where it has none, through a `call`
taken over. What differs between families is data: the scale of the
logits, the band of a sliding window and where it lives, attention sinks,
ALiBi, attention dropout, decoding from the mode's state, what cannot be
converted, and a tiny model to test it on. A `Family` holds that for one
attention class; `FAMILIES` maps class names to them.

A class without a record whose hook has Llama's signature
(`_llm_hook.has_llama_hook`) gets the default record, Llama's behaviour:
`Family()`. Adding a family is one record here plus its rows in
`tests/convert/test_llm_conversion.py`.
"""

import dataclasses
from collections.abc import Callable

from keras_svr_attention.convert import _llm_hook as hooks
from keras_svr_attention.convert._llm_hook import attribute
from keras_svr_attention.convert._subclass import subclass


def inv_norm_factor(layer):
    """The scale the layer keeps: Llama's `_inv_norm_factor`, Bloom's and
    Falcon's `inv_norm_factor`; None (1 / sqrt(head_dim)) without one."""
    return attribute(layer, "inv_norm_factor")


def gemma_scale(layer):
    """Gemma's 1 / sqrt(head_dim), or 1 / sqrt(hidden_dim / heads) without
    `query_head_dim_normalize`."""
    if getattr(layer, "query_head_dim_normalize", True) is False:
        return (layer.hidden_dim // layer.num_query_heads) ** -0.5
    return None


def unit_scale(layer):
    """1: QK-norm in place of 1 / sqrt(head_dim) (Gemma 4)."""
    return 1.0


def window_size(layer):
    """The band |pos(i) - j| < w: `sliding_window_size` when
    `use_sliding_window_attention` (Qwen, Qwen3, Gemma), else the layer's
    `sliding_window` (Mistral's i < j + w), else None."""
    size = getattr(layer, "sliding_window_size", None)
    if size and getattr(layer, "use_sliding_window_attention", True):
        return int(size)
    size = attribute(layer, "sliding_window")
    return int(size) if size else None


def window_from_left_edge(layer):
    """GPT-OSS's band j >= pos(i) - w, as |pos(i) - j| < w + 1."""
    size = attribute(layer, "sliding_window")
    return int(size) + 1 if size else None


def hook_dropout(layer):
    """The rate of dropout on the attention weights that the layer's hook
    applies when it takes `training` (GPT-NeoX); else 0."""
    return (
        getattr(layer, "dropout", 0) if hooks.hook_takes_training(layer) else 0
    )


def call_dropout(layer):
    """The rate of dropout Bloom's and Falcon's `call` applies to the
    attention weights."""
    return attribute(layer, "dropout") or attribute(
        layer, "attention_dropout_rate"
    )


@dataclasses.dataclass(frozen=True)
class Family:
    """What conversion needs to know of one attention class.

    Attributes:
        name: the family as the tests and the guide name it.
        scale: `layer -> float | None`, the logits' scale (None:
            1 / sqrt(head_dim)).
        window: `layer -> int | None`, the band |pos(i) - j| < w of the
            layer's sliding window, or None.
        band_in_mask: the band reaches the hook only inside the decoder's
            mask (Mistral, Mixtral, Gemma 4), where it cannot be told from
            padding: the hook undoes its lower edge and applies the band
            itself, so SH windows count the keys the full forward counts.
        sinks: the layer's `sinks` join each row's softmax denominator.
        alibi: the layer adds ALiBi's bias to its logits.
        dropout: `layer -> float`, the rate of dropout on its attention
            weights, which SVR attention does not apply (refused if > 0).
        call: the mixin conversion puts before the layer's class:
            `HookedAttention` (the hook), or one that takes over `call`.
        state_call: the mixin whose `call` decodes from the mode's state
            (`state_cache=True`), or None.
        cache_tuple: the family's causal LM carries its layers' caches as
            a tuple (Gemma 3), not stacked on axis 1.
        blocked: a feature SVR attention does not compose with yet, in
            words; the layer is refused naming it.
        example: a tiny model of the family for the tests: `backbone` and
            `task` (KerasHub class names) and `config`, or None.
    """

    name: str = "llama-like"
    scale: Callable = inv_norm_factor
    window: Callable = window_size
    band_in_mask: bool = False
    sinks: bool = False
    alibi: bool = False
    dropout: Callable = hook_dropout
    call: type = hooks.HookedAttention
    state_call: type | None = None
    cache_tuple: bool = False
    blocked: str | None = None
    example: dict | None = None

    def softmax_only_features(self, layer):
        """What the layer's attention does that only the softmax kernel
        composes with, in words: its window, sinks, ALiBi."""
        features, band = [], self.window(layer)
        if band:
            features.append(
                f"sliding_window={band} (the linear kernel takes no sliding "
                "window: a band mask would make it quadratic)"
            )
        if self.sinks:
            features.append(
                "attention sinks (the linear kernel has no softmax "
                "denominator for them)"
            )
        if self.alibi:
            features.append(
                "ALiBi, a position bias on the logits (the linear kernel "
                "has no logits to add it to)"
            )
        return features


def _example(backbone, task, gqa=True, **config):
    """A tiny model: 2 layers, width 16, 40 tokens; 4 query and 2
    key/value heads with `gqa`; `config` on top."""
    tiny = {
        "vocabulary_size": 40,
        "num_layers": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    }
    if gqa:
        tiny.update(num_query_heads=4, num_key_value_heads=2)
    return {"backbone": backbone, "task": task, "config": {**tiny, **config}}


_MOE = {"num_experts": 2, "top_k": 1, "moe_intermediate_dim": 8}

DEFAULT = Family()

FAMILIES = {
    "LlamaAttention": Family(
        "llama",
        state_call=hooks.RotaryState,
        example=_example("LlamaBackbone", "LlamaCausalLM",
                         max_sequence_length=32),
    ),
    # The same hook, the band in the decoder's mask.
    "CachedMistralAttention": Family(
        "mistral",
        state_call=hooks.RotaryState,
        band_in_mask=True,
        example=_example("MistralBackbone", "MistralCausalLM",
                         sliding_window=6),
    ),
    "CachedMixtralAttention": Family(
        "mixtral",
        state_call=hooks.RotaryState,
        band_in_mask=True,
        example=_example("MixtralBackbone", "MixtralCausalLM",
                         sliding_window=6, num_experts=2, top_k=1),
    ),
    # Its own rotary scaling, in its rotary layer: Llama's hook and state.
    "Phi3Attention": Family(
        "phi3",
        state_call=hooks.RotaryState,
        example=_example("Phi3Backbone", "Phi3CausalLM"),
    ),
    # The hook takes the cache index.
    "QwenAttention": Family(
        "qwen",
        state_call=hooks.RotaryState,
        example=_example("QwenBackbone", "QwenCausalLM"),
    ),
    # QK-norm before the hook, a sliding window in it.
    "Qwen3Attention": Family(
        "qwen3",
        state_call=hooks.RotaryState,
        example=_example("Qwen3Backbone", "Qwen3CausalLM", head_dim=4),
    ),
    "QwenMoeAttention": Family(
        "qwen-moe",
        state_call=hooks.RotaryState,
        example=_example("QwenMoeBackbone", "QwenMoeCausalLM",
                         shared_expert_intermediate_dim=8, **_MOE),
    ),
    "Qwen3MoeAttention": Family(
        "qwen3-moe",
        state_call=hooks.RotaryState,
        example=_example("Qwen3MoeBackbone", "Qwen3MoeCausalLM",
                         head_dim=4, **_MOE),
    ),
    # The cache index reaches the hook itself; a NoPE layer.
    "SmolLM3Attention": Family(
        "smollm3",
        state_call=hooks.SmolLM3State,
        example=_example(
            "SmolLM3Backbone", "SmolLM3CausalLM", gqa=False,
            num_attention_heads=4, num_key_value_heads=2,
            attention_bias=False, attention_dropout=0.0, mlp_bias=False,
            rope_layer_enabled_list=[True, False],
            layer_types=["attention"] * 2, layer_norm_epsilon=1e-6,
            max_position_embeddings=32, rope_theta=10000.0,
            partial_rotary_factor=1.0,
        ),
    ),
    # Soft-capped logits, a window every other layer, its own scale.
    "CachedGemmaAttention": Family(
        "gemma",
        scale=gemma_scale,
        state_call=hooks.GemmaState,
        example=_example(
            "GemmaBackbone", "GemmaCausalLM", head_dim=4,
            attention_logit_soft_cap=0.5, final_logit_soft_cap=30.0,
            use_sliding_window_attention=True, sliding_window_size=4,
            query_head_dim_normalize=False,
        ),
    ),
    # QK-norm, 5 local : 1 global (layer 5 global, RoPE at 1e6).
    "CachedGemma3Attention": Family(
        "gemma3",
        scale=gemma_scale,
        state_call=hooks.GemmaState,
        cache_tuple=True,
        example=_example(
            "Gemma3Backbone", "Gemma3CausalLM", num_layers=6,
            image_size=None, head_dim=4, use_sliding_window_attention=True,
            sliding_window_size=4,
        ),
    ),
    # QK- and V-norm in place of the scale, the band in the decoder's
    # mask, 5 local : 1 global.
    "Gemma4TextAttention": Family(
        "gemma4",
        scale=unit_scale,
        band_in_mask=True,
        example=_example(
            "Gemma4Backbone", "Gemma4CausalLM", num_layers=6,
            image_size=None, head_dim=4, sliding_window_size=4,
        ),
    ),
    # Learned sinks, a window j >= pos(i) - w.
    "GptOssAttention": Family(
        "gpt-oss",
        window=window_from_left_edge,
        sinks=True,
        state_call=hooks.GptOssState,
        example=_example("GptOssBackbone", "GptOssCausalLM", num_experts=2,
                         sliding_window=3),
    ),
    # No GQA, partial rotary, the hook's dropout; its cached step rotated
    # the query from position 0, so `call` is taken over.
    "GPTNeoXAttention": Family(
        "neox",
        call=hooks.NeoXRotary,
        state_call=hooks.NeoXState,
        example=_example("GPTNeoXBackbone", "GPTNeoXCausalLM", gqa=False,
                         num_heads=4, max_sequence_length=32,
                         rotary_percentage=0.5),
    ),
    # ALiBi inside `call`, no hook: `call` taken over.
    "BloomAttention": Family(
        "bloom",
        alibi=True,
        dropout=call_dropout,
        call=hooks.BloomALiBi,
        state_call=hooks.BloomState,
        example=_example("BloomBackbone", "BloomCausalLM", gqa=False,
                         num_heads=2),
    ),
    "FalconAttention": Family(
        "falcon",
        alibi=True,
        dropout=call_dropout,
        call=hooks.FalconALiBi,
        state_call=hooks.FalconState,
        example=_example("FalconBackbone", "FalconCausalLM", gqa=False,
                         num_attention_heads=2),
    ),
    "DisentangledSelfAttention": Family(
        "deberta-v3",
        blocked="DeBERTa's disentangled attention (its content-to-position "
        "and position-to-content scores)",
    ),
    "T5MultiHeadAttention": Family(
        "t5", blocked="T5's relative position bias"
    ),
}  # fmt: skip


def base_class(layer):
    """The layer's own class, under any mixin conversion gave it."""
    return next(
        c
        for c in type(layer).__mro__
        if not issubclass(c, hooks.HookedAttention)
    )


def of(layer):
    """The layer's record, or the default one."""
    return FAMILIES.get(base_class(layer).__name__, DEFAULT)


def is_hookable(layer):
    """A decoder-LLM attention layer conversion gives the hook: one whose
    record takes over `call`, or one with Llama's call and hook."""
    family = of(layer)
    if family.blocked:
        return False
    return family.call is not hooks.HookedAttention or hooks.has_llama_hook(
        layer
    )


def refusal(layer, images_both_ways=False):
    """Why the hookable or recorded `layer` cannot be converted, in words,
    or None. `images_both_ways`: the model's image tokens attend to each
    other both ways through the decoder's mask."""
    name = type(layer).__name__
    family = of(layer)
    if family.blocked:
        return (
            f"{name} has {family.blocked}, which SVR attention does not "
            "compose with yet"
        )
    if getattr(layer, "use_bidirectional_attention", False):
        return (
            f"{name} has bidirectional attention "
            "(use_bidirectional_attention=True), and SVR attention in the "
            "decoder's hook is causal"
        )
    if images_both_ways:
        return (
            f"{name} lets the model's image tokens attend to each other "
            "both ways (a vision encoder's prefix), and SVR attention in "
            "the decoder's hook is causal"
        )
    return None


def state_classes():
    """The attention classes that decode from their mode's state."""
    return sorted(n for n, f in FAMILIES.items() if f.state_call)


def hook(layer, options):
    """Gives `layer` the SVR hook with `options` (a dict of
    `_llm_hook.HOOK_OPTIONS`): its record's mixin before its own class."""
    family = of(layer)
    mixin = family.call
    if options.get("state_cache"):
        mixin = family.state_call
    layer._svr_hook_options = dict(options)
    layer._svr_family = family
    layer.__class__ = subclass(mixin, base_class(layer))
    return layer
