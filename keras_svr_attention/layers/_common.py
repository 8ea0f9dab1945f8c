"""Steps that SVRAttention and SVRGroupedQueryAttention share, around the
functional core: input masks in, hook masks out."""

from keras import ops

from keras_svr_attention.functional import visibility


def consume_masks(query, value, key, query_mask, value_mask, key_mask):
    """`(query, value, key, key_mask)` ready to project: `key` defaults to
    `value` (its mask then ignored, as in MultiHeadAttention), and tensors
    whose Keras masks are consumed here are copied, since a sublayer given a
    tensor with a Keras mask attached warns that it drops it."""
    key_is_value = key is None or key is value
    key = value if key is None else key
    key_mask = None if key_is_value else key_mask
    if query_mask is not None:
        query = ops.copy(query)
    if value_mask is not None or key_mask is not None:
        value = ops.copy(value)
        key = value if key_is_value else ops.copy(key)
    return query, value, key, key_mask


def group_hook_mask(group, query, key, fast):
    """The mask a head group's softmax hook receives.

    `fast` (the layer's own hook, causality alone): None, with
    `use_causal_mask=True` passed beside it so that a fused kernel takes
    `is_causal=True`, as MultiHeadAttention's causal fast path. Otherwise
    the finished mask (overrides, the older signature too, get the causal
    mask built, as under MultiHeadAttention).
    """
    if fast:
        return None
    if group.causal_only:
        return visibility.with_causal_mask(None, query, key)
    return group.mask


def hook_causal_mask(attention_mask, use_causal_mask, query, key):
    """The hooks' `use_causal_mask`, as MultiHeadAttention's: also applies
    j <= i on top of `attention_mask`. Returns `(mask, causal_only)`;
    alone, causality is left to the kernel (`causal_only`)."""
    causal_only = use_causal_mask and attention_mask is None
    if use_causal_mask and attention_mask is not None:
        attention_mask = visibility.with_causal_mask(attention_mask, query, key)
    return attention_mask, causal_only


def beta_value(layer):
    """b of Eqn 26: the learned scalar (float32) or `options.beta` (0 when
    off)."""
    if layer.options.learn_beta:
        return ops.cast(layer.beta_weight, "float32")
    return layer.options.beta or 0.0


def dropout_fn(layer, rate, training):
    """Dropout on attention weights through the layer's own Dropout, or
    None when off."""
    if not rate or not training:
        return None

    def dropout(weights):
        return layer._dropout_layer(weights, training=training)

    return dropout
