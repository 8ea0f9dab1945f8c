"""SVR attention inside decoder LLM attention layers (KerasHub's Llama,
Mistral, Qwen, Qwen3 and the MoE variants, SmolLM3, GPT-NeoX,
Gemma, Gemma 3, Gemma 4, GPT-OSS, Bloom, Falcon and layers built the same
way): the mixins conversion puts before the layer's own class. What each
family needs of them is its record in `families`.

Such a layer projects, applies its rotary embedding (and QK-norm), writes
its cache, repeats K/V to the query heads, then calls the hook
`_compute_attention(query, key, value, attention_mask)` (some also pass
the cache index). `HookedAttention` makes that hook
`svr_dot_product_attention`, causal at the cache index that `call`
received, so that pooled windows follow the causal rule and stale cache
slots are never seen; the record gives it the family's scale, band,
sinks. Bloom and Falcon have no hook: their attention adds ALiBi's bias
inside `call`, which `CallTakenOver` takes over with their own
projections and cache (`key_bias`), as it does GPT-NeoX's, whose cached
step rotated its query from position 0. The layer keeps its weights,
rotary embedding, cache and projections."""

import inspect
import math

from keras import ops

from keras_svr_attention.functional import decoding
from keras_svr_attention.functional import recurrent
from keras_svr_attention.functional.options import repeat_factors
from keras_svr_attention.functional.options import svr_options
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
    "state_cache",
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


def query_heads(layer):
    """The layer's query heads, under any of the families' names."""
    for name in ("num_query_heads", "num_attention_heads", "num_heads"):
        if attribute(layer, name) is not None:
            return attribute(layer, name)
    return None


def hook_takes_training(layer):
    """Whether the layer's hook takes `training` (GPT-NeoX's, for the
    dropout on its attention weights)."""
    hook = inspect.signature(type(layer)._compute_attention).parameters
    return "training" in hook


def has_llama_hook(layer):
    """A decoder-LLM attention layer with Llama's call and hook: key/value
    heads, a hook `_compute_attention` of one of the `HOOKS` signatures,
    and the cache index reaching it."""
    hook = getattr(type(layer), "_compute_attention", None)
    if hook is None or key_value_heads(layer) is None:
        return False
    names = _named_parameters(hook)
    # The cache index reaches the hook through `call` or (SmolLM3) itself.
    return names in HOOKS and "cache_update_index" in (
        _named_parameters(type(layer).call) + names
    )


def _named_parameters(function):
    """The names of `function`'s parameters, without `*args`/`**kwargs`
    (Qwen-MoE's hook takes `**kwargs` it never reads)."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind not in variadic
    ]


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
        key_bias=None,
    ):
        options = dict(self._svr_hook_options)
        options.pop("state_cache", None)
        if cache_update_index is None:  # GPT-OSS names it start_index
            cache_update_index = start_index
        factors = options.pop("head_factors", None)
        if factors is not None:  # per key/value head -> per head of `key`
            # (Llama's hook gets K/V repeated to the query heads, Gemma's not)
            factors = repeat_factors(factors, key.shape[2] // len(factors))
        offset = (
            getattr(self, "_svr_offset", 0)
            if cache_update_index is None
            else cache_update_index
        )
        family = self._svr_family
        window = family.window(self)
        if attention_mask is not None:
            attention_mask = ops.cast(attention_mask, "bool")[:, None]
            if window and family.band_in_mask:
                attention_mask = _behind_the_band(
                    attention_mask, offset, window
                )
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
            scale=family.scale(self),
            head_factors=factors,
            causal_offset=offset,
            sliding_window=window,
            logit_soft_cap=getattr(self, "logit_soft_cap", None),
            sinks=self.sinks if family.sinks else None,
            key_bias=key_bias,
            **options,
        )
        return ops.cast(out, query.dtype)


def _behind_the_band(mask, offset, window):
    """A decoder's mask `(B, 1, T, S)` with its band's lower edge undone:
    keys j <= pos(i) - w, which KerasHub's decoders never pad (prompts are
    right-padded; generated tokens are real), marked visible again. The op
    applies the band itself (`sliding_window`), so visibility is unchanged,
    while those keys count in their SH windows as in the full forward (the
    rules page, "Windows")."""
    rows = ops.arange(ops.shape(mask)[2])[:, None] + offset
    behind = ops.arange(ops.shape(mask)[3])[None, :] <= rows - window
    return ops.logical_or(mask, behind)


class CallTakenOver(HookedAttention):
    """A layer whose `call` conversion takes over, keeping its projections
    and cache: Bloom and Falcon, which add ALiBi's bias inside `call` and
    have no hook, and GPT-NeoX, whose cached step rotates its query as if
    at position 0."""

    def _svr_call(
        self, query, key, value, mask, cache, index, key_bias=None, rotate=None
    ):
        """Writes the cache at `index` (KerasHub's contract: `(B, 2, S, N,
        H)`, read as it is when `index` is None), applies `rotate(query,
        key, index)` to the heads if given, attends with `key_bias` and
        projects the output: `(output, cache)`."""
        if cache is not None:
            if index is None:
                key, value = cache[:, 0], cache[:, 1]
            else:
                key, value, cache = decoding.write_key_value_cache(
                    cache, index, key, value
                )
        index = 0 if index is None else index
        if rotate is not None:
            query, key = rotate(query, key, index)
        out = self._compute_attention(
            query, key, value, mask, cache_update_index=index, key_bias=key_bias
        )
        return self._output(out), cache

    def _output(self, out):
        """The heads `(B, T, N, D)` joined, then the output projection."""
        batch, length = ops.shape(out)[0], ops.shape(out)[1]
        out = ops.reshape(out, (batch, length, out.shape[2] * out.shape[3]))
        return attribute(self, "output_dense")(out)

    def _biased_call(self, x, key_bias, mask, cache, index):
        """Bloom's and Falcon's `call` once their bias is known: their
        query, key and value projections, then `_svr_call`; the output
        alone without a cache, as their own `call` returns."""
        heads = [
            attribute(self, name + "_dense")(x)
            for name in ("query", "key", "value")
        ]
        out, cache = self._svr_call(
            *heads, mask, cache=cache, index=index, key_bias=key_bias
        )
        return out if cache is None else (out, cache)


class BloomALiBi(CallTakenOver):
    """Bloom's ALiBi: m_h (j - S + 1) from its own `AlibiBias` layer, after
    the scale (the rules page, "ALiBi")."""

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
    ):
        length = ops.shape(hidden_states if cache is None else cache[:, 0])[1]
        zeros = ops.zeros((1, self.num_heads, 1, length), self.compute_dtype)
        bias = self._alibi_layer(zeros)[:, :, 0]
        return self._biased_call(
            hidden_states, bias, attention_mask, cache, cache_update_index
        )


class FalconALiBi(CallTakenOver):
    """Falcon's ALiBi: the decoder's `alibi` `(B, N, 1, S)`, added before
    the scale (the rules page, "ALiBi")."""

    def call(
        self,
        inputs,
        alibi,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
    ):
        bias = alibi[:, :, 0] * ops.cast(self.inv_norm_factor, alibi.dtype)
        return self._biased_call(
            inputs, bias, attention_mask, cache, cache_update_index
        )


class NeoXRotary(CallTakenOver):
    """GPT-NeoX's partial rotary embedding, the query at its cache index:
    the first `rotary_dim` features of each head rotated, queries from
    `cache_update_index`, the keys (cached unrotated) from 0."""

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        heads = self._qkv_dense(hidden_states)
        size = self.attn_head_size
        return self._svr_call(
            heads[..., :size], heads[..., size : 2 * size],
            heads[..., 2 * size :], attention_mask,
            cache=cache, index=cache_update_index, rotate=self._rotate,
        )  # fmt: skip

    def _rotate(self, query, key, index, key_index=0):
        """The query heads partially rotated from `index`, the key heads
        from `key_index`."""
        rotary, d = self.rotary_embedding_layer, self.rotary_dim
        return (
            partial_rotary(rotary, query, d, index),
            partial_rotary(rotary, key, d, key_index),
        )


def partial_rotary(rotary, heads, rotary_dim, start):
    """`heads` with their first `rotary_dim` features rotated by the
    `rotary` embedding layer from position `start`, the rest kept
    (GPT-NeoX's and GPT-OSS's partial rotary embedding)."""
    rotated = rotary(heads[..., :rotary_dim], start_index=start)
    return ops.concatenate([rotated, heads[..., rotary_dim:]], axis=-1)


class RotaryState(HookedAttention):
    """Llama-style attention decoding from its mode's state (the decoding
    page): a cache is a packed state, whose new tokens are projected,
    QK-normed where the layer has it (Qwen3) and rotated at
    `cache_update_index` as the layer's `call` does, then laid in: per
    key/value head under the family's band for the softmax modes
    (`functional.decoding`), so SH's pooled slots and GQA's shared heads
    both shrink it; per query head for the linear kernel
    (`functional.recurrent`). A call without a cache is the layer's own,
    with the hook. For Llama, Qwen, Qwen-MoE, Qwen3, Qwen3-MoE, Mistral,
    Mixtral and Phi-3, whose `call`s differ only in those steps; SmolLM3,
    Gemma, Gemma 3, GPT-OSS, GPT-NeoX, Bloom and Falcon subclass it."""

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        if cache is None:
            return super().call(
                hidden_states, attention_mask=attention_mask,
                training=training,
            )  # fmt: skip
        index = 0 if cache_update_index is None else cache_update_index
        return self._decode(hidden_states, cache, index)

    def _decode(self, hidden_states, cache, index):
        """The new tokens at `index` through the packed state `cache` ->
        `(output, the packed state)`."""
        query, key, value = self._new_heads(hidden_states, index)
        out, cache = self._state_step(query, key, value, cache)
        return self._output(out), cache

    def _new_heads(self, hidden_states, index):
        """The new tokens' query, key and value heads `(B, T, n, D)`, the
        query and key rotated from `index`."""
        query = self._rotated(hidden_states, "query", index)
        key = self._rotated(hidden_states, "key", index)
        return query, key, attribute(self, "value_dense")(hidden_states)

    def _output(self, out):
        """The output projection of the attention heads `(B, T, N, D)`."""
        return attribute(self, "output_dense")(out)

    def _state_step(self, query, key, value, cache):
        """The new tokens' heads `(B, T, n, D)` (n query, key/value heads)
        laid into the packed state `cache` -> `(attention output (B, T, n,
        D), the packed state)`."""
        options, dim = self._svr_state_options(), self._svr_head_dim()
        limit = getattr(self, "_prefill_limit", None)
        if options.kernel == "linear":  # the state is per query head
            state = recurrent.unpack_state(cache, options, dim)
            out, state = recurrent.linear_recurrence(
                query, key, value, state, options, limit=limit
            )
            cache = recurrent.pack_state(state)
        else:
            # The LM's `_build_cache` gives the length its states were
            # made for: they are padded to one size where layers differ.
            size, length = cache.shape[-1], getattr(self, "_max_length", None)
            state = decoding.unpack_state(
                cache, options,
                key_dim=dim, value_dim=dim, dtype=self.compute_dtype,
                max_length=length,
            )  # fmt: skip
            out, state = decoding.decode(
                query, key, value, state, options, limit=limit,
                scale=self._svr_family.scale(self),
                sinks=self.sinks if self._svr_family.sinks else None,
                slopes=self._svr_slopes() if self._svr_family.alibi else None,
            )  # fmt: skip
            cache = decoding.pack_state(state, size)
        return ops.cast(out, self.compute_dtype), cache

    def _rotated(self, hidden_states, name, index):
        """The query or key heads of the new tokens: projected, normed if
        the layer norms them, rotated from `index`."""
        heads = attribute(self, name + "_dense")(hidden_states)
        norm = attribute(self, name + "_dense_layer_norm")
        if norm is not None:
            heads = norm(heads)
        return self.rotary_embedding_layer(heads, start_index=index)

    def _svr_head_dim(self):
        return attribute(self, "key_dense").kernel.shape[-1]

    def get_initial_state(self, batch_size, max_length, packed=True):
        """The packed state before any token, for `max_length` tokens."""
        options, dim = self._svr_state_options(), self._svr_head_dim()
        if options.kernel == "linear":
            state = recurrent.initial_state(options, batch_size, dim, dim)
            return recurrent.pack_state(state)
        state = decoding.initial_state(
            options, batch_size, max_length,
            key_dim=dim, value_dim=dim, dtype=self.compute_dtype,
        )  # fmt: skip
        return decoding.pack_state(state)

    def _svr_state_options(self):
        """The options of the state: per key/value head with the family's
        band (softmax), per query head (linear)."""
        options = dict(self._svr_hook_options)
        options.pop("state_cache", None)
        heads = key_value_heads(self)
        if options.get("kernel") == "linear":
            repeats = query_heads(self) // heads
            options = svr_options(heads, **options)
            return options.per_query_head(repeats)
        return svr_options(
            heads,
            sliding_window=self._svr_family.window(self),
            logit_soft_cap=getattr(self, "logit_soft_cap", None),
            **options,
        )


class SmolLM3State(RotaryState):
    """SmolLM3's attention decoding from its mode's state, as
    `RotaryState`: its projections are `q_proj`, `k_proj` and `v_proj`,
    flat, reshaped into heads, and `o_proj` from the heads; rotary
    embedding only in the layers that use it (NoPE layers: none); the
    cache under KerasHub's keyword names for SmolLM3."""

    def call(self, hidden_states, training=False, attention_mask=None, **kw):
        cache = kw.get("self_attention_cache")
        if cache is None:  # the layer's own call, with the hook
            return super(RotaryState, self).call(
                hidden_states, training=training,
                attention_mask=attention_mask, **kw,
            )  # fmt: skip
        index = kw.get("self_attention_cache_update_index")
        return self._decode(hidden_states, cache, 0 if index is None else index)

    def _new_heads(self, hidden_states, index):
        batch_and_length = tuple(ops.shape(hidden_states)[:-1])

        def heads(projection, num_heads):
            return ops.reshape(
                projection(hidden_states),
                (*batch_and_length, num_heads, self.head_dim),
            )

        num_kv_heads = self.num_key_value_heads
        query = heads(self.q_proj, self.num_attention_heads)
        key = heads(self.k_proj, num_kv_heads)
        value = heads(self.v_proj, num_kv_heads)
        if self.use_rope:
            cos, sin = self.rotary_embedding(query, start_index=index)
            query, key = smollm3_rotary(query, key, cos, sin)
        return query, key, value

    def _output(self, out):
        return self.o_proj(out)  # o_proj takes the heads

    def _svr_head_dim(self):
        return self.head_dim


class GemmaState(RotaryState):
    """Gemma's and Gemma 3's attention decoding from its mode's state, as
    `RotaryState`: its heads QK-normed where it norms them (Gemma 3) and
    rotated by its own `_apply_rope` (Gemma's layout of the rotary
    features, Gemma 3's wavelength per layer), its logits soft-capped in
    the state as in its hook, its band on the layers with a sliding
    window.

    Gemma 3's `cache_update_mask` keeps a prompt's image tokens out of
    the cache during generation; a state cannot skip a token, and a
    decoder with a vision encoder is refused, so it is not read."""

    def call(
        self,
        x,
        attention_mask=None,
        cache=None,
        cache_update_index=0,
        cache_update_mask=None,
        training=False,
    ):
        return super().call(
            x, attention_mask=attention_mask, cache=cache,
            cache_update_index=cache_update_index, training=training,
        )  # fmt: skip

    def _rotated(self, hidden_states, name, index):
        heads = attribute(self, name + "_dense")(hidden_states)
        if getattr(self, "use_query_key_norm", False):
            heads = getattr(self, name + "_norm")(heads)
        return self._apply_rope(heads, index)

    def _svr_head_dim(self):
        return self.head_dim


class GptOssState(RotaryState):
    """GPT-OSS's attention decoding from its mode's state, as
    `RotaryState`: the first `_rotary_dim` features of its heads rotated
    (all of them at an even head dimension), its learned sinks in each
    row's denominator, its band j >= pos(i) - w."""

    def _rotated(self, hidden_states, name, index):
        heads = attribute(self, name + "_dense")(hidden_states)
        return partial_rotary(
            self.rotary_embedding_layer, heads, self._rotary_dim, index
        )


class NeoXState(RotaryState, NeoXRotary):
    """GPT-NeoX's attention decoding from its mode's state, as
    `RotaryState`: its fused projection split into query, key and value
    heads, both query and key partially rotated at `cache_update_index`
    (the state keeps keys rotated, where NeoX's own cache keeps them
    unrotated). A call without a cache is `NeoXRotary`'s."""

    def _new_heads(self, hidden_states, index):
        heads, size = self._qkv_dense(hidden_states), self.attn_head_size
        query, key = heads[..., :size], heads[..., size : 2 * size]
        query, key = self._rotate(query, key, index, key_index=index)
        return query, key, heads[..., 2 * size :]

    _output = CallTakenOver._output  # its heads joined, as without a state

    def _svr_head_dim(self):
        return self.attn_head_size


class ALiBiState(RotaryState):
    """Bloom's and Falcon's attention decoding from its mode's state, as
    `RotaryState`: their projections, no rotary embedding, the heads
    joined before the output projection, and ALiBi's bias m_u pos(c) on
    each slot's logits (`decoding.decode`'s `slopes`, from
    `_svr_slopes`). A call without a cache is their taken-over one."""

    _output = CallTakenOver._output

    def _rotated(self, hidden_states, name, index):
        return attribute(self, name + "_dense")(hidden_states)


class BloomState(ALiBiState, BloomALiBi):
    """Bloom's attention decoding from its mode's state."""

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
    ):
        if cache is None:
            return BloomALiBi.call(self, hidden_states, attention_mask)
        index = 0 if cache_update_index is None else cache_update_index
        return self._decode(hidden_states, cache, index)

    def _svr_slopes(self):
        """m_u, read off Bloom's own `AlibiBias` layer (its bias after the
        scale) as the step between two keys."""
        zeros = ops.zeros((1, self.num_heads, 1, 2), "float32")
        bias = self._alibi_layer(zeros)[0, :, 0]
        return bias[:, 1] - bias[:, 0]


class FalconState(ALiBiState, FalconALiBi):
    """Falcon's attention decoding from its mode's state."""

    def call(
        self,
        inputs,
        alibi,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
    ):
        if cache is None:
            return FalconALiBi.call(self, inputs, alibi, attention_mask)
        # Its decoder builds `alibi` as long as the cache's axis 2 (1 for a
        # state): the slopes come from ALiBi's formula instead.
        index = 0 if cache_update_index is None else cache_update_index
        return self._decode(inputs, cache, index)

    def _svr_slopes(self):
        """m_u of Falcon's decoder (ALiBi's slopes), before the scale."""
        return [m * self.inv_norm_factor for m in alibi_slopes(self.num_heads)]


def alibi_slopes(num_heads):
    """ALiBi's slopes (Press et al. 2022): 2^(-8 i / n), i = 1 .. n, for
    n heads a power of two p; otherwise p's, then every other slope of
    2 p's for the n - p heads left."""
    p = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8 * i / p) for i in range(1, p + 1)]
    odd = [2 ** (-8 * i / (2 * p)) for i in range(1, 2 * p + 1, 2)]
    return slopes + odd[: num_heads - p]


def smollm3_rotary(query, key, cos, sin):
    """Rotary embedding as SmolLM3 applies it to `(B, T, n, D)` heads:
    x cos + rotate_half(x) sin, with `cos` and `sin` `(B, T, D)` laid over
    the heads and rotate_half(x) = (-x[D/2:], x[:D/2])."""
    cos, sin = ops.expand_dims(cos, 2), ops.expand_dims(sin, 2)

    def rotate(x):
        half = x.shape[-1] // 2
        halves = ops.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + halves * sin

    return rotate(query), rotate(key)
