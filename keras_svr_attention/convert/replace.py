"""Converting existing models: every MultiHeadAttention becomes SVR attention.

The new attention keeps the old layer's config (heads, dims, dropout,
initializers, dtype policy) and its weights; with every option off it
computes what the old layer computed.
"""

import sys
import warnings

import keras

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.convert import _keras_internals as internals
from keras_svr_attention.convert import _llm_hook as llm
from keras_svr_attention.convert import _record as record
from keras_svr_attention.convert import _state_decoding as state_decoding
from keras_svr_attention.convert import families
from keras_svr_attention.functional.options import factors_per_head
from keras_svr_attention.layers import presets
from keras_svr_attention.layers.grouped_query_attention import (
    SVRGroupedQueryAttention,
)
from keras_svr_attention.layers.svr_attention import SVRAttention

_SVR_CLASSES = (SVRAttention, SVRGroupedQueryAttention)


def _cached_attention_class():
    """KerasHub's public `CachedMultiHeadAttention`, when KerasHub is in use
    (a model built with it has imported it), else None."""
    keras_hub = sys.modules.get("keras_hub")
    layers = getattr(keras_hub, "layers", None)
    return getattr(layers, "CachedMultiHeadAttention", None)


def _honoured(layer):
    """Keras's MultiHeadAttention, KerasHub's cached one, or SVR attention:
    the calls SVRAttention honours."""
    cls = type(layer)
    return (
        cls is keras.layers.MultiHeadAttention
        or cls is keras.layers.GroupQueryAttention
        or isinstance(layer, _SVR_CLASSES)
        or (cls is not None and cls is _cached_attention_class())
        or families.is_hookable(layer)
    )


def _looks_like_attention(layer):
    """MultiHeadAttention and its subclasses, and other attention layers by
    their class name (GroupedQueryAttention, KerasHub's model-specific
    attentions), so that those are named rather than silently kept."""
    return isinstance(layer, keras.layers.MultiHeadAttention) or (
        type(layer).__name__.endswith("Attention")
        and not isinstance(layer, keras.Model)
    )


def _unsupported_reason(layer, images_both_ways=False):
    """Why `layer` cannot become SVR attention, or None if it can.
    `images_both_ways`: the model has a vision encoder whose image tokens
    attend to each other both ways through the decoder's mask."""
    if families.is_hookable(layer) or families.of(layer).blocked:
        return families.refusal(layer, images_both_ways)
    if not _honoured(layer):
        return (
            f"{type(layer).__name__} is not a MultiHeadAttention or "
            "GroupQueryAttention whose call the SVR layers honour"
        )
    axes = layer.get_config().get("attention_axes")
    if axes not in (None, 1, (1,), [1]):
        return (
            f"attention_axes={axes!r}: SVR attention attends over the "
            "sequence axis only"
        )
    return None


def _svr_config(layer, attention, options):
    """SVRAttention config for `layer`, or ValueError naming the layer."""
    if families.is_hookable(layer):
        return {"svr_hook": _hook_options(layer, attention, options)}
    config = dict(layer.get_config())
    options = dict(options)
    state = options.pop("state_cache", False)
    if type(layer) is _cached_attention_class():
        # Called as KerasHub calls it (no Keras masks), and, in a causal LM
        # that decodes with its mode's state, with the state as its cache.
        config["decode_with_state"] = state
    target = record.target_class(config)
    if issubclass(target, SVRAttention):
        config["attention_axes"] = None
    try:
        # SH factors: one per head, or per key/value head under GQA.
        heads = config.get("num_key_value_heads", config.get("num_heads"))
        svr_options = presets.options_for(attention, heads, **options)
        merged = {**config, **svr_options}
        target(**merged)  # every check, nothing built
    except ValueError as error:
        raise ValueError(
            f"Cannot convert layer {layer.name!r} "
            f"({type(layer).__name__}) to attention={attention!r}: {error}"
        ) from None
    return merged


def _hook_options(layer, attention, options):
    """The op's options for a decoder-LLM attention layer (per key/value
    head factors), checked, or ValueError naming the layer."""
    try:
        family = families.of(layer)
        num_kv_heads = llm.key_value_heads(layer)
        rate = family.dropout(layer)
        if rate:
            raise ValueError(
                "it applies dropout to the attention weights, which SVR "
                "attention in the hook does not: build it with no attention "
                f"dropout. Received: attention dropout rate {rate}"
            )
        hooked = presets.options_for(attention, num_kv_heads, **options)
        features = family.softmax_only_features(layer)
        if hooked.get("state_cache") and family.state_call is None:
            raise ValueError(
                "`state_cache=True` (decoding from the mode's state) is "
                f"taken by {families.state_classes()}. Received: "
                f"{type(layer).__name__}"
            )
        if hooked.get("kernel") == "linear" and features:
            raise ValueError(
                "this layer's attention has " + "; ".join(features)
                + ". Received: kernel='linear'"
            )  # fmt: skip
        extra = set(hooked) - set(llm.HOOK_OPTIONS)
        if extra:
            raise ValueError(
                f"options {sorted(extra)} need weights or masks of their own"
                f"; {type(layer).__name__} takes {list(llm.HOOK_OPTIONS)}"
            )
        if "head_factors" in hooked:
            hooked["head_factors"] = list(
                factors_per_head(
                    hooked["head_factors"], num_kv_heads, "num_key_value_heads"
                )
            )
    except ValueError as error:
        raise ValueError(
            f"Cannot convert layer {layer.name!r} "
            f"({type(layer).__name__}) to attention={attention!r}: {error}"
        ) from None
    return hooked


@svr_export
def replace_attention(
    model, attention="bn+sh", skip_unsupported=False, **options
):
    """Returns a copy of `model` whose MultiHeadAttention layers are SVR
    attention, with their weights.

    Every `keras.layers.MultiHeadAttention` (and KerasHub's
    `CachedMultiHeadAttention`, whose cache the SVR layer honours) becomes
    `get(attention, **options)` with the old layer's config: heads, dims,
    dropout, initializers, dtype policy, and its weights. The original
    model is left unchanged. With every option off ("softmax"), the new
    model computes what the old one did.

    It reaches Sequential and functional models, nested models, and layers
    that hold attention as attributes (KerasHub's TransformerEncoder and
    TransformerDecoder, backbones such as BERT, ViT and GPT-2).

    Args:
        model: a built `keras.Model`.
        attention: a name of `get`: "softmax", "bn", "sh", "bn+sh",
            "linear+bn", ... Defaults to "bn+sh".
        skip_unsupported: bool. Leave attention layers that cannot be
            converted (another attention class, `attention_axes` other than
            the sequence) as they are, with a warning, instead of raising.
        **options: `SVRAttention` options (`beta`, `head_factors`,
            `num_prefix_tokens`, ...), applied to every converted layer.

    Returns:
        A new `keras.Model`.

    Raises:
        ValueError: naming the layer and the argument, before anything is
            built, when the model has no attention layer, the name is
            unknown, options do not fit a layer (`head_factors` of another
            length than its heads), or a layer cannot be converted.

    Examples:
        >>> inputs = keras.Input((6, 8))
        >>> x = keras.layers.MultiHeadAttention(2, 4)(inputs, inputs)
        >>> model = keras.Model(inputs, x)
        >>> svr = replace_attention(model, "bn+sh", head_factors=[1, 2])
        >>> [type(layer).__name__ for layer in svr.layers][-1]
        'SVRAttention'
    """
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"`model` must be a keras.Model. Received: model={model!r}"
        )
    if not model.built:
        raise ValueError(
            f"`model` must be built (called once or given inputs). "
            f"Received: model={model.name!r}, not built"
        )
    presets.options_for(attention, 1, check_only=True)
    convertible = _convertible_layers(model, skip_unsupported)
    state = _decodes_with_state(model, attention, options, convertible)
    if state:
        options = {**options, "state_cache": True}
    configs = {
        id(layer): _svr_config(layer, attention, options)
        for layer in convertible
    }
    # 1. Layers that appear in the model's config (Sequential, functional,
    #    nested models) are rewritten there.
    by_name = {
        layer.name: configs[id(layer)]
        for layer in convertible
        if "svr_hook" not in configs[id(layer)]
    }
    serialized = keras.saving.serialize_keras_object(model)
    _rewrite_config(serialized, by_name)
    preprocessor = _preprocessor(model, serialized)
    if preprocessor is not None:
        # Rebuilt without it: a config holds no tokenizer vocabulary (an
        # asset), and a tokenizer rebuilt without one flattens to other
        # layers. The copy shares the original's preprocessor below.
        serialized["config"]["preprocessor"] = None
    # The model's own classes, registered or not, rebuild its copy.
    classes = {
        type(layer).__name__: type(layer)
        for layer in internals.flatten_layers(model, include_self=True)
    }
    for cls in _SVR_CLASSES:
        classes[keras.saving.get_registered_name(cls)] = cls
    new = keras.saving.deserialize_keras_object(
        serialized, custom_objects=classes
    )
    # 2. Layers created inside other layers (KerasHub's TransformerEncoder)
    #    are swapped on the built copy, in place, and recorded where
    #    `.keras` loading will find them.
    old_layers = internals.flatten_layers(model)
    if preprocessor is not None:
        skipped = internals.flatten_layers(preprocessor, include_self=True)
        skipped = {id(layer) for layer in skipped}
        old_layers = [x for x in old_layers if id(x) not in skipped]
    swapped = _swap_attributes(new, old_layers, configs)
    record.record_conversion(new, swapped)
    _copy_weights(old_layers, internals.flatten_layers(new))
    if preprocessor is not None:
        new.preprocessor = preprocessor
    return state_decoding.mark(new) if state else new


def _preprocessor(model, serialized):
    """A KerasHub task's attached preprocessor (tokenizer, packer, image
    converter) that its config rebuilds, or None. It holds no weights and
    nothing attention computes, so the converted task shares it:
    `generate("a string")`, `fit` on strings and `.keras` saving work as
    on the original."""
    preprocessor = getattr(model, "preprocessor", None)
    config = serialized.get("config")
    if isinstance(preprocessor, keras.Layer) and "preprocessor" in config:
        return preprocessor
    return None


def _decodes_with_state(model, attention, options, layers):
    """A KerasHub causal LM converted to a mode with a decoding state (no
    sparse pattern, no convolution) whose every attention is KerasHub's
    cached one, or one whose record has a `state_call`: it
    generates with its layers' states (`_state_decoding`)."""
    named = presets.options_for(attention, 1)
    chosen = {**named, **{k: v for k, v in options.items() if v is not None}}
    cached = _cached_attention_class()
    takes_state = all(type(layer) is cached for layer in layers) or all(
        families.of(layer).state_call for layer in layers
    )
    return (
        not chosen.get("sparsity")
        and not chosen.get("conv_kernel_size")
        and state_decoding.can_decode_with_state(model)
        and takes_state
    )


def _convertible_layers(model, skip_unsupported):
    """The attention layers of `model` to convert; the others refused (a
    ValueError) or, with `skip_unsupported`, kept with a warning."""
    convertible, refused = [], []
    images = any(
        getattr(layer, name, None) is not None
        for layer in internals.flatten_layers(model, include_self=True)
        for name in ("vision_encoder", "vit_encoder")  # Gemma 3, PaliGemma
    )
    for layer in internals.flatten_layers(model):
        if _looks_like_attention(layer):
            reason = _unsupported_reason(layer, images)
            (refused if reason else convertible).append((layer, reason))
    if not convertible:
        found = [f"{layer.name} ({why})" for layer, why in refused]
        raise ValueError(
            f"`model` {model.name!r} has no MultiHeadAttention layer to "
            f"convert{f'; found {found}' if found else ''}."
        )
    for layer, reason in refused:
        message = f"Attention layer {layer.name!r} is not converted: {reason}."
        if not skip_unsupported:
            raise ValueError(
                message + " Pass skip_unsupported=True to keep it."
            )
        warnings.warn(message, stacklevel=3)
    return [layer for layer, _ in convertible]


def _rewrite_config(node, by_name):
    """Replaces the serialized MultiHeadAttention layers named in `by_name`."""
    if isinstance(node, list):
        for item in node:
            _rewrite_config(item, by_name)
        return
    if not isinstance(node, dict):
        return
    config = node.get("config")
    if (
        isinstance(config, dict)
        and "class_name" in node
        and config.get("name") in by_name
        and ("num_heads" in config or "num_query_heads" in config)
    ):
        cls = record.target_class(config)
        node["module"] = cls.__module__
        node["class_name"] = cls.__name__
        node["registered_name"] = keras.saving.get_registered_name(cls)
        node["config"] = by_name[config["name"]]
        return
    for value in node.values():
        _rewrite_config(value, by_name)


def _swap_attributes(model, old_layers, configs):
    """Swaps attention held as attributes of other layers (not a functional
    model's own layers, which step 1 rewrote), kept in place in the owner's
    sublayers so that both models flatten in the same order. Returns
    `{id(new layer): its config}` of the layers swapped."""
    swapped = {}
    new_layers = internals.flatten_layers(model)
    for old, current in zip(old_layers, new_layers, strict=True):
        if id(old) not in configs:
            continue
        owner, _ = record.owner_of(model, current)
        if isinstance(owner, keras.Model) and current in owner.layers:
            continue
        replacement = record.apply(model, current, configs[id(old)])
        swapped[id(replacement)] = configs[id(old)]
    return swapped


def _copy_weights(old_layers, new_layers):
    for old, new in zip(old_layers, new_layers, strict=True):
        old_vars = internals.variables(old)
        new_vars = internals.variables(new)
        if isinstance(new, _SVR_CLASSES) and not isinstance(old, _SVR_CLASSES):
            continue  # the SVR layer's own weights (beta, conv) keep theirs
        if len(old_vars) > len(new_vars):
            raise ValueError(
                f"Layer {old.name!r} has {len(old_vars)} weights but its "
                f"converted copy {new.name!r} has {len(new_vars)}: it holds "
                "weights its config does not describe (LoRA enabled, or "
                "quantized?). Convert first, then enable LoRA or quantize."
            )
        for source, target in zip(old_vars, new_vars, strict=False):
            # A copy, not the same buffer: JAX's fit donates the converted
            # model's buffers, which must not take the original's with them.
            target.assign(keras.ops.copy(source.value))
