"""The private Keras pieces that model conversion needs, in one place.

Keras offers no public way to list a model's layers recursively, to find
the attribute that holds a sublayer, or to swap a built layer's sublayer.
The `convert` package reaches them only through this module, and
`tests/convert/test_keras_internals.py` pins each piece to the Keras versions we
support (the floor in pyproject.toml and the newest tested).
"""


def flatten_layers(layer, include_self=False):
    """Every layer under `layer`, depth first, in tracking order."""
    return list(layer._flatten_layers(include_self=include_self))


def sublayers(layer):
    """The layers `layer` tracks directly."""
    return list(layer._layers)


def variables(layer):
    """The layer's own variables (not its sublayers'), trainable first."""
    return layer._trainable_variables + layer._non_trainable_variables


def attribute_holding(owner, target):
    """The name of `owner`'s attribute that holds `target`, or None.

    Attributes live in `__dict__`, or in torch's module registry when the
    backend's layers are torch modules.
    """
    attributes = {**vars(owner), **(vars(owner).get("_modules") or {})}
    for name, value in attributes.items():
        if value is target:
            return name
    return None


def swap_sublayer(owner, name, old, new):
    """Replaces `owner.<name>` (`old`) by `new`, tracked at `old`'s place,
    so that the model flattens in the same order as before."""
    index = [id(sub) for sub in owner._layers].index(id(old))
    tracker = owner._tracker
    locked = tracker.locked
    tracker.unlock()
    tracker.untrack(old)
    setattr(owner, name, new)
    owner._layers.insert(index, owner._layers.pop())
    if locked:
        tracker.lock()


def attention_build_shapes(layer):
    """`build()` arguments of a built MultiHeadAttention.

    Its recorded build shapes when `build` went through Keras's wrapper;
    else the feature sizes of its projection kernels (a layer that its
    owner built by calling `build` directly records none).
    """
    config = layer.get_build_config() or {}
    if "shapes_dict" in config:
        return config["shapes_dict"]
    dims = [
        dense.kernel.shape[0]
        for dense in (layer._query_dense, layer._value_dense, layer._key_dense)
    ]
    return {
        f"{name}_shape": (None, None, dim)
        for name, dim in zip(("query", "value", "key"), dims, strict=True)
    }
