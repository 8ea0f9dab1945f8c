"""Small layers of the model builders: CLS token, positions, token select."""

import keras
from keras import ops

from keras_svr_attention.api_export import svr_export


@svr_export
class ClassToken(keras.layers.Layer):
    """Prepends one learned token: `(B, T, C)` -> `(B, 1 + T, C)`."""

    def build(self, input_shape):
        self.token = self.add_weight(
            name="token", shape=(1, 1, input_shape[-1]), initializer="zeros"
        )

    def call(self, x):
        token = ops.cast(self.token, x.dtype)
        token = ops.broadcast_to(token, (ops.shape(x)[0], 1, x.shape[-1]))
        return ops.concatenate([token, x], axis=1)

    def compute_output_shape(self, input_shape):
        length = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], length, input_shape[2])


@svr_export
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position `t < max_length`."""

    def __init__(self, max_length, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True
        self.max_length = max_length

    def build(self, input_shape):
        self.embedding = self.add_weight(
            name="embedding",
            shape=(self.max_length, input_shape[-1]),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )

    def call(self, x):
        length = x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]
        return x + ops.cast(self.embedding[:length], x.dtype)[None]

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length}


@svr_export
class SelectToken(keras.layers.Layer):
    """`(B, T, C)` -> `(B, C)`: the token at `index` (the CLS token at 0)."""

    def __init__(self, index=0, **kwargs):
        super().__init__(**kwargs)
        self.index = index

    def call(self, x):
        return x[:, self.index]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "index": self.index}
