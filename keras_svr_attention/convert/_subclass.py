"""Classes made at conversion time: a model's or layer's own class with a
mixin before it (the LLM hook, a converted model's record, state
decoding), one class per (mixin, base), under the base's own name."""

import keras

_SUBCLASSES = {}


def subclass(mixin, base, registered_name=None):
    """`base` with `mixin` before it, named and placed as `base`.

    With `registered_name`, registered with Keras under that name in our
    package, so that `.keras` loading finds the mixin's `from_config`
    (which rebuilds `base`).
    """
    if (mixin, base) not in _SUBCLASSES:
        cls = type(base.__name__, (mixin, base), {})
        cls.__module__ = base.__module__
        if registered_name:
            cls = keras.saving.register_keras_serializable(
                package="keras_svr_attention", name=registered_name
            )(cls)
        _SUBCLASSES[mixin, base] = cls
    return _SUBCLASSES[mixin, base]
