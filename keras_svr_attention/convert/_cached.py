"""What a converted KerasHub `CachedMultiHeadAttention` becomes: SVR
attention with KerasHub's calling convention, kept out of `SVRAttention`.

KerasHub's decoders (GPT-2's `TransformerDecoder`) call their attention
as `CachedMultiHeadAttention` takes it: no Keras masks (the decoder's
`attention_mask` holds the padding), and `cache` with `cache_update_index`
while generating. A causal LM that `replace_attention` makes decode with
its mode's state (`_state_decoding`) passes each layer's state packed in
one tensor as that `cache`.
"""

import keras
from keras import ops

from keras_svr_attention.functional._tensors import shape_of
from keras_svr_attention.functional.options import boolean
from keras_svr_attention.layers import _common as common
from keras_svr_attention.layers.svr_attention import SVRAttention


@keras.saving.register_keras_serializable(package="keras_svr_attention")
class CachedSVRAttention(SVRAttention):
    """`SVRAttention` called as KerasHub's `CachedMultiHeadAttention`.

    The inputs' Keras masks are not applied: the original's call takes
    none, so Keras never gave it them. With `decode_with_state`, the layer
    serves a causal LM that decodes with its mode's state:

    - without a cache, `attention_mask` is the decoder's mask, causal and
      key padding: its last row is taken as the key padding and causality
      as `use_causal_mask` (the linear kernel takes no other mask);
    - with one, `cache` is the state packed in one tensor
      (`get_initial_state(packed=True)`), unpacked, advanced over the new
      tokens and packed again; the decoder's mask and index are not read
      (the state holds the positions).

    Args:
        decode_with_state: bool. As above; False: `cache` is the key/value
            cache `(B, 2, S, N, key_dim)` at `cache_update_index`.
        **kwargs: `SVRAttention`'s arguments.
    """

    def __init__(self, decode_with_state=False, **kwargs):
        super().__init__(**kwargs)
        self.decode_with_state = boolean("decode_with_state", decode_with_state)
        key_dim, value_dim = self._head_dims()
        if self.decode_with_state and (
            self.options.conv_kernel_size
            or (self.options.kernel == "linear" and value_dim != key_dim)
        ):
            raise ValueError(
                "`decode_with_state=True` needs no `conv_kernel_size` (a "
                "convolved key needs the tokens after it) and, with "
                "kernel='linear', `value_dim` None or equal to `key_dim` "
                "(the state is packed in rows of key_dim). Received: "
                f"kernel={self.options.kernel!r}, conv_kernel_size="
                f"{self.options.conv_kernel_size!r}, key_dim={key_dim}, "
                f"value_dim={value_dim!r}"
            )

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        # The masks Keras finds on the inputs are dropped (the tensors
        # copied, so that the projections do not warn of a mask dropped).
        query, value, key, _, _ = common.input_masks(
            query, value, key,
            query_mask=query_mask, value_mask=value_mask, key_mask=key_mask,
        )  # fmt: skip
        if not self.decode_with_state:
            return super().call(
                query, value, key, attention_mask=attention_mask,
                training=training, cache=cache,
                cache_update_index=cache_update_index,
            )  # fmt: skip
        if cache is not None:
            output, state = super().call(
                query, value, key, training=training,
                use_causal_mask=True, cache=self._unpack_state(cache),
            )  # fmt: skip
            return output, self._pack_state(state)
        padding = None
        if attention_mask is not None:  # (B|1, T, S) or (T, S)
            padding = ops.cast(attention_mask, "bool")[..., -1, :]
            padding = ops.broadcast_to(padding, shape_of(value)[:2])
        return super().call(
            query, value, key, value_mask=padding, training=training,
            use_causal_mask=True,
        )  # fmt: skip

    def get_config(self):
        config = super().get_config()
        config["decode_with_state"] = self.decode_with_state
        return config


def describes(config):
    """Whether a converted layer's config is this class's (a file saved
    before it: `SVRAttention.from_config`)."""
    return "decode_with_state" in config
