"""The record of a conversion, kept in a converted model's config so that
`.keras` loading replays it, and the replay itself (a hook or a swap)."""

import keras

from keras_svr_attention.convert import _cached
from keras_svr_attention.convert import _keras_internals as internals
from keras_svr_attention.convert import families
from keras_svr_attention.convert._subclass import subclass
from keras_svr_attention.layers.grouped_query_attention import (
    SVRGroupedQueryAttention,
)
from keras_svr_attention.layers.svr_attention import SVRAttention


def target_class(config):
    """The SVR class a converted layer's config builds."""
    if "num_query_heads" in config:
        return SVRGroupedQueryAttention
    if _cached.describes(config):
        return _cached.CachedSVRAttention
    return SVRAttention


def apply(model, layer, config):
    """The recorded conversion of one layer: a hook, or a swap."""
    if "svr_hook" in config:
        return families.hook(layer, config["svr_hook"])
    return _swap(model, layer, config)


def _swap(model, current, config):
    owner, name = owner_of(model, current)
    if name is None:
        raise ValueError(
            f"Cannot find the attribute of {owner.name!r} that holds "
            f"attention {current.name!r}."
        )
    replacement = target_class(config).from_config(config)
    if current.built:
        replacement.build(**internals.attention_build_shapes(current))
    internals.swap_sublayer(owner, name, current, replacement)
    return replacement


def owner_of(model, target):
    """`(layer, attribute name)` of the layer under `model` that holds
    `target`."""
    for layer in internals.flatten_layers(model, include_self=True):
        if any(sub is target for sub in internals.sublayers(layer)):
            return layer, internals.attribute_holding(layer, target)
    raise ValueError(
        f"Cannot find the layer that holds attention {target.name!r}."
    )


# Saving. A model rebuilt from its own config (a KerasHub backbone builds
# its blocks, and they their attention, from numbers) would come back with
# MultiHeadAttention. The nearest model that holds swapped layers is given
# a subclass of its own class that records the swap in its config, under
# one registered name whose `from_config` rebuilds the original class and
# swaps the recorded layers again (weights are loaded after that).
_RECORD = "svr_attention_conversion"
_CONVERTED_NAME = "ConvertedModel"


class _Converted:
    """Mixin of converted models: the record in the config, and back."""

    def get_config(self):
        return {**super().get_config(), _RECORD: self._svr_conversion}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        record = config.pop(_RECORD)
        model = keras.saving.deserialize_keras_object(
            {**record["base"], "config": config},
            custom_objects=custom_objects,
        )
        swapped = {}
        for names, layer_config in record["layers"]:
            layer = _recorded_layer(model, names)
            replacement = apply(model, layer, layer_config)
            swapped[id(replacement)] = layer_config
        record_conversion(model, swapped)
        return model


def _recorded_layer(model, names):
    """The layer at the path of `names` under `model`, or a ValueError
    naming the path and the first name the model lacks."""
    layer = model
    for depth, name in enumerate(names):
        found = [sub for sub in internals.sublayers(layer) if sub.name == name]
        if len(found) != 1:
            path = "/".join(names)
            have = sorted(sub.name for sub in internals.sublayers(layer))
            raise ValueError(
                f"The conversion record of {model.name!r} does not match "
                f"the model: it converts the attention layer {path!r}, but "
                f"{'/'.join(names[:depth]) or model.name!r} holds "
                f"{'no' if not found else len(found)} layer named "
                f"{name!r} (its layers: {have}). Load the file with the "
                "model it was saved from."
            )
        (layer,) = found
    return layer


@keras.saving.register_keras_serializable(
    package="keras_svr_attention", name=_CONVERTED_NAME
)
class ConvertedModel(_Converted):
    """What `keras.saving.load_model` finds under the registered name: a
    converted model's record, rebuilt by `_Converted.from_config`."""


def record_conversion(model, swapped):
    """Marks the nearest model holding each swapped layer (see above)."""
    for holder in [model] + [
        layer
        for layer in internals.flatten_layers(model)
        if isinstance(layer, keras.Model)
    ]:
        record = [
            (names, swapped[id(layer)])
            for names, layer in _name_paths(holder)
            if id(layer) in swapped
        ]
        if not record:
            continue
        base = type(holder)
        if issubclass(base, _Converted):
            base = base.__mro__[2]  # (converted, _Converted, base, ...)
        holder._svr_conversion = {"base": class_record(base), "layers": record}
        holder.__class__ = subclass(_Converted, base, _CONVERTED_NAME)


def _name_paths(model, prefix=()):
    """`(names from model to layer, layer)` for the layers under `model`
    outside nested models: names, unlike tracking order, are the same on
    every backend."""
    for layer in internals.sublayers(model):
        if isinstance(layer, keras.Model):
            continue
        names = (*prefix, layer.name)
        yield list(names), layer
        yield from _name_paths(layer, names)


def class_record(cls):
    """What `keras.saving.deserialize_keras_object` needs to find `cls`."""
    return {
        "module": cls.__module__,
        "class_name": cls.__name__,
        "registered_name": keras.saving.get_registered_name(cls),
    }
