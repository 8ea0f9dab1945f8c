"""Registration of public classes as Keras serializables."""

import keras


def svr_export(cls):
    """Registers `cls` under the package `keras_svr_attention`.

    `keras.saving.load_model` then finds it by name without `custom_objects`.
    """
    return keras.saving.register_keras_serializable(
        package="keras_svr_attention"
    )(cls)
