"""Converting existing models: every MultiHeadAttention becomes SVR attention.

The new attention keeps the old layer's config (heads, dims, dropout,
initializers, dtype policy) and its weights; with every option off it
computes what the old layer computed (SPEC.md section 6).
"""

import warnings

import keras

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.layers import presets
from keras_svr_attention.layers.svr_attention import SVRAttention

# KerasHub's cached MultiHeadAttention, whose `cache` / `cache_update_index`
# contract SVRAttention honours (matched by name: keras-hub is optional).
_KERAS_HUB_CACHED = (
    "keras_hub.src.layers.modeling.cached_multi_head_attention",
    "CachedMultiHeadAttention",
)
_SVR_MODULE = SVRAttention.__module__
_SVR_NAME = keras.saving.get_registered_name(SVRAttention)


def _honoured(layer):
    """Keras's MultiHeadAttention, KerasHub's cached one, or SVR attention:
    the calls SVRAttention honours."""
    cls = type(layer)
    return (
        cls is keras.layers.MultiHeadAttention
        or isinstance(layer, SVRAttention)
        or (cls.__module__, cls.__name__) == _KERAS_HUB_CACHED
    )


def _looks_like_attention(layer):
    """MultiHeadAttention and its subclasses, and other attention layers by
    their class name (GroupedQueryAttention, KerasHub's model-specific
    attentions), so that those are named rather than silently kept."""
    return isinstance(layer, keras.layers.MultiHeadAttention) or (
        type(layer).__name__.endswith("Attention")
        and not isinstance(layer, keras.Model)
    )


def _unsupported_reason(layer):
    """Why `layer` cannot become SVR attention, or None if it can."""
    if not _honoured(layer):
        return (
            f"{type(layer).__name__} is not a MultiHeadAttention whose call "
            "SVRAttention honours"
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
    config = dict(layer.get_config())
    config["attention_axes"] = None
    try:
        svr_options = presets.options_for(
            attention, config["num_heads"], **options
        )
        merged = {**config, **svr_options}
        SVRAttention.from_config(merged)  # every check, nothing built
    except (ValueError, TypeError) as error:
        # from_config wraps the layer's ValueError in a TypeError.
        cause = error.__context__ if isinstance(error, TypeError) else error
        raise ValueError(
            f"Cannot convert layer {layer.name!r} "
            f"({type(layer).__name__}) to attention={attention!r}: "
            f"{cause or error}"
        ) from None
    return merged


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

    Example:

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
    layers = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if _looks_like_attention(layer)
    ]
    convertible, refused = [], []
    for layer in layers:
        reason = _unsupported_reason(layer)
        (refused if reason else convertible).append((layer, reason))
    if not convertible:
        raise ValueError(
            f"`model` {model.name!r} has no MultiHeadAttention layer to "
            "convert"
            + (
                f"; found {[f'{layer.name} ({why})' for layer, why in refused]}"
                if refused
                else ""
            )
            + "."
        )
    for layer, reason in refused:
        message = f"Attention layer {layer.name!r} is not converted: {reason}."
        if not skip_unsupported:
            raise ValueError(
                message + " Pass skip_unsupported=True to keep it."
            )
        warnings.warn(message, stacklevel=2)
    configs = {
        id(layer): _svr_config(layer, attention, options)
        for layer, _ in convertible
    }

    # 1. Layers that appear in the model's config (Sequential, functional,
    #    nested models) are rewritten there.
    by_name = {layer.name: configs[id(layer)] for layer, _ in convertible}
    serialized = keras.saving.serialize_keras_object(model)
    _rewrite_config(serialized, by_name)
    # The model's own classes, registered or not, rebuild its copy.
    classes = {
        type(layer).__name__: type(layer)
        for layer in model._flatten_layers(include_self=True)
    }
    classes[_SVR_NAME] = SVRAttention
    new = keras.saving.deserialize_keras_object(
        serialized, custom_objects=classes
    )
    # 2. Layers created inside other layers (KerasHub's TransformerEncoder)
    #    are swapped on the built copy, in place.
    old_layers = list(model._flatten_layers(include_self=False))
    _swap_attributes(new, old_layers, configs)
    new_layers = list(new._flatten_layers(include_self=False))
    _copy_weights(old_layers, new_layers)
    return new


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
        and "num_heads" in config
    ):
        node["module"] = _SVR_MODULE
        node["class_name"] = "SVRAttention"
        node["registered_name"] = _SVR_NAME
        node["config"] = by_name[config["name"]]
        return
    for value in node.values():
        _rewrite_config(value, by_name)


def _swap_attributes(new_model, old_layers, configs):
    """Swaps attention held as attributes of other layers, kept in place in
    the owner's sublayers so that both models flatten in the same order."""
    new_layers = list(new_model._flatten_layers(include_self=False))
    for old, current in zip(old_layers, new_layers, strict=True):
        if id(old) not in configs or isinstance(current, SVRAttention):
            continue
        owner, name = _owner_of(new_model, current)
        replacement = SVRAttention.from_config(configs[id(old)])
        shapes = current.get_build_config()["shapes_dict"]
        replacement.build(**shapes)
        index = [id(sub) for sub in owner._layers].index(id(current))
        # Keras offers no public way to swap a built layer's sublayer: open
        # its tracker, untrack the old layer, track the new one at the same
        # place, close it again.
        tracker = owner._tracker
        locked = tracker.locked
        tracker.unlock()
        tracker.untrack(current)
        setattr(owner, name, replacement)
        owner._layers.insert(index, owner._layers.pop())
        if locked:
            tracker.lock()


def _owner_of(model, target):
    for layer in model._flatten_layers(include_self=True):
        if not any(sub is target for sub in layer._layers):
            continue
        # Attributes live in __dict__, or in torch's module registry when
        # the backend's layers are torch modules.
        attributes = {**vars(layer), **(vars(layer).get("_modules") or {})}
        for name, value in attributes.items():
            if value is target:
                return layer, name
    raise ValueError(
        f"Cannot find the layer that holds attention {target.name!r}."
    )


def _copy_weights(old_layers, new_layers):
    for old, new in zip(old_layers, new_layers, strict=True):
        old_vars = old._trainable_variables + old._non_trainable_variables
        new_vars = new._trainable_variables + new._non_trainable_variables
        if isinstance(new, SVRAttention) and not isinstance(old, SVRAttention):
            continue  # the SVR layer's own weights (beta, conv) keep theirs
        if len(old_vars) > len(new_vars):
            raise ValueError(
                f"Layer {old.name!r} has {len(old_vars)} weights but its "
                f"converted copy {new.name!r} has {len(new_vars)}."
            )
        for source, target in zip(old_vars, new_vars, strict=False):
            # A copy, not the same buffer: JAX's fit donates the converted
            # model's buffers, which must not take the original's with them.
            target.assign(keras.ops.copy(source.value))
