"""SVR attention inside decoder LLM attention layers (KerasHub's Llama,
Mistral, Qwen, Qwen3, GPT-NeoX, Gemma, GPT-OSS and layers built the same
way).

Such a layer projects, applies its rotary embedding (and Qwen3 its QK-norm),
writes its cache, repeats K/V to the query heads, then calls the hook
`_compute_attention(query, key, value, attention_mask)` (Qwen's also takes
`cache_update_index`; Gemma's caps its logits and GPT-OSS's adds attention
sinks, which the op does to the SVR logits). Conversion gives
the layer a subclass of its own class (its weights, rotary embedding,
cache and projections stay its own) whose hook is
`svr_dot_product_attention`, causal at the cache index that `call`
received, so that pooled windows follow the causal rule and stale cache
slots are never seen.
"""

import inspect

from keras import ops

from keras_svr_attention.ops import svr_dot_product_attention

# The op's options a hooked layer takes (no weights of its own: no
# learn_beta, no convolution).
HOOK_OPTIONS = (
    "beta",
    "standardize",
    "epsilon",
    "head_factors",
    "kernel",
    "num_prefix_tokens",
)


def attribute(layer, name):
    """`layer.<name>`, or `layer._<name>` (Llama spells them without the
    underscore, Mistral with), or None."""
    value = getattr(layer, name, None)
    return getattr(layer, "_" + name, None) if value is None else value


def key_value_heads(layer):
    """The layer's key/value heads (all its heads without GQA: GPT-NeoX),
    or None."""
    heads = attribute(layer, "num_key_value_heads")
    return attribute(layer, "num_heads") if heads is None else heads


def drops_attention_weights(layer):
    """Whether the layer's own hook applies dropout to the attention
    weights (GPT-NeoX's takes `training` for it)."""
    hook = inspect.signature(type(layer)._compute_attention).parameters
    return "training" in hook and bool(getattr(layer, "dropout", 0))


def is_hookable(layer):
    """A decoder-LLM attention layer with Llama's call and hook."""
    hook = getattr(type(layer), "_compute_attention", None)
    if hook is None or key_value_heads(layer) is None:
        return False
    names = list(inspect.signature(hook).parameters)
    call = list(inspect.signature(type(layer).call).parameters)
    return names in HOOKS and "cache_update_index" in call


# The hook signatures taken: Llama's and Mistral's, Qwen's (the cache
# index), GPT-NeoX's (`training`, for its attention dropout), Gemma's.
HOOK = ["self", "query", "key", "value", "attention_mask"]
HOOKS = [
    HOOK,
    HOOK + ["cache_update_index"],
    HOOK + ["training"],
    ["self", "q", "k", "v", "attention_mask", "training", "cache_update_index"],
    HOOK + ["start_index"],  # GPT-OSS's: the cache index, its sinks
]


def logit_scale(layer):
    """The scale of the layer's logits: Llama's `_inv_norm_factor`;
    Gemma's 1 / sqrt(head_dim), or 1 / sqrt(hidden_dim / heads) without
    `query_head_dim_normalize`; else None (1 / sqrt(head_dim))."""
    scale = getattr(layer, "_inv_norm_factor", None)
    normalize = getattr(layer, "query_head_dim_normalize", None)
    if scale is None and normalize is False:
        scale = (layer.hidden_dim // layer.num_query_heads) ** -0.5
    return scale


def sliding_window(layer):
    """The band the layer's own hook applies, as |pos(i) - j| < w: Qwen's
    and Gemma's, when `use_sliding_window_attention`; Qwen3's whenever
    `sliding_window_size` is set; GPT-OSS's j >= pos(i) - w, so w + 1. None
    for Llama, and Mistral, whose band is in its mask."""
    size = getattr(layer, "sliding_window_size", None)
    if size and getattr(layer, "use_sliding_window_attention", True):
        return int(size)
    size = getattr(layer, "sliding_window", None)
    if size and hasattr(layer, "sinks"):
        return int(size) + 1
    return None


class HookedAttention:
    """Mixin put before the layer's own class."""

    def call(self, *args, cache_update_index=None, **kwargs):
        # The hook gets no index: keep it for the hook during this call.
        self._svr_offset = (
            0 if cache_update_index is None else cache_update_index
        )
        if cache_update_index is not None:  # else the layer's own default
            kwargs["cache_update_index"] = cache_update_index
        return super().call(*args, **kwargs)

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        cache_update_index=None,
        training=None,
        start_index=None,
    ):
        options = dict(self._svr_hook_options)
        if cache_update_index is None:  # GPT-OSS names it start_index
            cache_update_index = start_index
        factors = options.pop("head_factors", None)
        if factors is not None:  # per key/value head -> per head of `key`
            # (Llama's hook gets K/V repeated to the query heads, Gemma's not)
            groups = key.shape[2] // len(factors)
            factors = [f for f in factors for _ in range(groups)]
        if attention_mask is not None:
            attention_mask = ops.cast(attention_mask, "bool")[:, None]
            if options.get("kernel") == "linear":
                # The decoder's mask is causal and key padding: the linear
                # kernel takes the padding, its last row; causality comes
                # from `is_causal` at the cache index.
                attention_mask = attention_mask[..., -1:, :]
        out = svr_dot_product_attention(
            query,
            key,
            value,
            mask=attention_mask,
            is_causal=True,
            scale=logit_scale(self),
            head_factors=factors,
            causal_offset=getattr(self, "_svr_offset", 0)
            if cache_update_index is None
            else cache_update_index,
            sliding_window=sliding_window(self),
            logit_soft_cap=getattr(self, "logit_soft_cap", None),
            sinks=getattr(self, "sinks", None),
            **options,
        )
        return ops.cast(out, query.dtype)


_CLASSES = {}


def hook(layer, options):
    """Gives `layer` the SVR hook with `options` (a dict of HOOK_OPTIONS)."""
    base = type(layer)
    if issubclass(base, HookedAttention):
        base = base.__mro__[2]
    if base not in _CLASSES:
        _CLASSES[base] = type(base.__name__, (HookedAttention, base), {})
        _CLASSES[base].__module__ = base.__module__
    layer._svr_hook_options = dict(options)
    layer.__class__ = _CLASSES[base]
    return layer
