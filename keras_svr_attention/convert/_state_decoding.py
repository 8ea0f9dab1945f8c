"""KerasHub causal LMs whose attention is KerasHub's cached one (GPT-2),
or one whose `families` record has a `state_call` (Llama, Qwen, Qwen3,
Mistral, Mixtral and their MoE variants, Phi-3, SmolLM3, GPT-NeoX,
Gemma, Gemma 3, GPT-OSS, Bloom, Falcon), generate with their mode's
decoding state (the rules page, "Decoding state" and "Linear state")
instead of a key/value cache: SH's pooled keys and values, Attention-BN's
running sums, the linear kernel's recurrent state.

The LM's own plumbing is kept: `call_with_cache` slices one cache tensor
per decoder layer and stacks them back, so each layer's state travels
packed in one tensor (`CachedSVRAttention(decode_with_state=True)`, or
the hook's `state_cache` option; `get_initial_state(packed=True)`). Two
methods change:

- `_build_cache` stacks the layers' initial states for the token buffer's
  length and prefills them with one call over the buffer;
- `generate_step` tells that prefill where decoding will resume. KerasHub's
  `generate_step` prefills the whole padded buffer and then resumes at the
  shortest prompt, rewriting key/value slots; a state cannot be rewound,
  so the prefill lets only the tokens before that point enter it.
"""

import keras
from keras import ops

from keras_svr_attention.convert import _keras_internals as internals
from keras_svr_attention.convert import _record as record
from keras_svr_attention.convert import families
from keras_svr_attention.convert._cached import CachedSVRAttention
from keras_svr_attention.convert._subclass import subclass

_MARK = "svr_state_decoding"
_NAME = "StateDecodingCausalLM"
_METHODS = ("_build_cache", "call_with_cache", "generate_step")


def can_decode_with_state(model):
    """Whether `model` is a causal LM whose cache plumbing takes a state."""
    return hasattr(model, "backbone") and all(
        callable(getattr(model, name, None)) for name in _METHODS
    )


def state_layers(model):
    """The attention layers under `model` that decode with a state."""
    return [
        layer
        for layer in internals.flatten_layers(model)
        if (isinstance(layer, CachedSVRAttention) and layer.decode_with_state)
        or getattr(layer, "_svr_hook_options", {}).get("state_cache")
    ]


class _StateDecoding:
    """Mixin of a causal LM whose attention decodes with the state."""

    def _build_cache(self, token_ids, *args, **kwargs):
        """The layers' initial states, stacked as the LM stacks its
        caches, then prefilled over `token_ids` (positions from 0)."""
        layers = state_layers(self)
        batch, length = ops.shape(token_ids)[0], token_ids.shape[1]
        states = [
            layer.get_initial_state(batch, length, packed=True)
            for layer in layers
        ]
        for layer in layers:
            layer._max_length = length
        # Packed softmax states that differ in size (a band on some layers
        # only) are padded to the largest; each layer reads its own for
        # `length`, wherever it stands in the LM.
        size = max(state.shape[-1] for state in states)
        states = [
            ops.pad(state, [(0, 0)] * 3 + [(0, size - state.shape[-1])])
            if state.shape[-1] < size
            else state
            for state in states
        ]
        if families.of(layers[0]).cache_tuple:  # Gemma 3: one per layer
            cache = tuple(states)
        else:
            cache = ops.stack(states, axis=1)
        limit = getattr(self, "_svr_prefill_limit", None)
        for layer in layers:
            layer._prefill_limit = limit
        try:
            # The index as a tensor, as KerasHub's own `_build_cache`
            # passes it (SmolLM3's blocks take it in `**kwargs`, where
            # Keras refuses a Python int beside a tensor).
            index = ops.convert_to_tensor(0, "int32")
            _, hidden_states, cache = self.call_with_cache(
                token_ids, cache, index
            )
        finally:
            for layer in layers:
                layer._prefill_limit = None
        return hidden_states, cache

    def generate_step(self, inputs, stop_token_ids=None):
        # KerasHub resumes at the shortest prompt's end: token index - 1
        # goes in first, at position index - 1.
        lengths = ops.sum(ops.cast(inputs["padding_mask"], "int32"), axis=-1)
        self._svr_prefill_limit = ops.maximum(ops.min(lengths) - 1, 0)
        try:
            return super().generate_step(inputs, stop_token_ids=stop_token_ids)
        finally:
            self._svr_prefill_limit = None

    def get_config(self):
        base = type(self).__mro__[2]
        return {**super().get_config(), _MARK: record.class_record(base)}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        base = config.pop(_MARK)
        model = keras.saving.deserialize_keras_object(
            {**base, "config": config}, custom_objects=custom_objects
        )
        mark(model)
        return model


def mark(model):
    """Makes `model` (a causal LM) generate with its layers' states; its
    `.keras` file loads it so."""
    base = type(model)
    if not issubclass(base, _StateDecoding):
        model.__class__ = subclass(_StateDecoding, base, _NAME)
    return model
