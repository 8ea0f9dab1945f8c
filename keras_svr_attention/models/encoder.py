"""Transformer encoder block with a choice of SVR attention."""

import keras
from keras import ops

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.layers import presets


@svr_export
class StochasticDepth(keras.layers.Layer):
    """Drops the whole residual branch of a sample with probability `rate`.

    In training, `x * bernoulli(1 - rate) / (1 - rate)` per sample; identity
    at inference (Huang et al. 2016, "Deep Networks with Stochastic Depth").
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0 <= rate < 1:
            raise ValueError(
                f"`rate` must be in [0, 1). Received: rate={rate!r}"
            )
        self.rate = rate
        self.seed = seed
        self._seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=None):
        if not training or self.rate == 0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        noise = keras.random.uniform(
            shape, dtype=x.dtype, seed=self._seed_generator
        )
        return x * ops.cast(noise < keep, x.dtype) / keep

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


@svr_export
class TransformerEncoderBlock(keras.layers.Layer):
    """Pre-LayerNorm transformer encoder block with an SVR attention.

    ```text
    x = x + drop_path(dropout(attention(LN(x), LN(x), masks)))
    x = x + drop_path(dropout(W_2 gelu(W_1 LN(x))))
    ```

    Args:
        num_heads: int. Attention heads.
        hidden_dim: int. Width of the MLP.
        attention: str or `SVRAttention`. A name of `presets.get`
            ("softmax", "bn", "sh", "bn+sh") or a configured layer.
        key_dim: int or None. Head dim; defaults to width // num_heads.
        beta: float or None. For "bn" / "bn+sh"; None keeps the default.
        head_factors: list of int or None. For "sh" / "bn+sh".
        num_prefix_tokens: int. Leading tokens never pooled (CLS).
        dropout: float. Dropout after attention and in the MLP.
        attention_dropout: float. Dropout on the attention weights.
        drop_path: float. Stochastic depth rate.
        normalize_first: bool. Pre-LN (True) or post-LN (False).
        layer_norm_epsilon: float.

    Call arguments:
        x: `(B, T, width)`.
        padding_mask: `(B, T)` boolean, True for real tokens, or None.
        use_causal_mask: bool.
        training: bool.

    Example:
    ```python
    block = TransformerEncoderBlock(num_heads=4, hidden_dim=128,
                                    attention="bn+sh")
    y = block(keras.random.normal((2, 10, 64)))
    ```
    """

    def __init__(
        self,
        num_heads,
        hidden_dim,
        attention="softmax",
        key_dim=None,
        beta=None,
        head_factors=None,
        num_prefix_tokens=0,
        dropout=0.0,
        attention_dropout=0.0,
        drop_path=0.0,
        normalize_first=True,
        layer_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.supports_masking = True
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        if isinstance(attention, dict):
            attention = keras.saving.deserialize_keras_object(attention)
        if not isinstance(attention, (str, keras.layers.Layer)):
            raise ValueError(
                "`attention` must be a name or a layer. Received: "
                f"attention={attention!r}"
            )
        if isinstance(attention, str):  # validate the options early
            presets.get(
                attention,
                num_heads,
                1,
                num_prefix_tokens=num_prefix_tokens,
                **presets.options_used_by(
                    attention, beta=beta, head_factors=head_factors
                ),
            )
        self.attention = attention
        self.key_dim = key_dim
        self.beta = beta
        self.head_factors = head_factors
        self.num_prefix_tokens = num_prefix_tokens
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.drop_path = drop_path
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon

    def build(self, input_shape):
        width = input_shape[-1]
        if isinstance(self.attention, str):
            self.attention_layer = presets.get(
                self.attention,
                self.num_heads,
                self.key_dim or max(width // self.num_heads, 1),
                num_prefix_tokens=self.num_prefix_tokens,
                dropout=self.attention_dropout,
                **presets.options_used_by(
                    self.attention,
                    beta=self.beta,
                    head_factors=self.head_factors,
                ),
                dtype=self.dtype_policy,
                name="attention",
            )
        else:
            self.attention_layer = self.attention
        kw = {"dtype": self.dtype_policy}
        self.norm1 = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="norm1", **kw
        )
        self.norm2 = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="norm2", **kw
        )
        self.mlp_in = keras.layers.Dense(
            self.hidden_dim, activation="gelu", name="mlp_in", **kw
        )
        self.mlp_out = keras.layers.Dense(width, name="mlp_out", **kw)
        self.drop = keras.layers.Dropout(self.dropout, **kw)
        self.path_drop = StochasticDepth(self.drop_path, **kw)
        if not self.attention_layer.built:
            self.attention_layer.build(input_shape, input_shape)
        self.norm1.build(input_shape)
        self.norm2.build(input_shape)
        self.mlp_in.build(input_shape)
        self.mlp_out.build(tuple(input_shape[:-1]) + (self.hidden_dim,))

    def _attend(self, x, padding_mask, use_causal_mask, training, scores):
        return self.attention_layer(
            x,
            x,
            query_mask=padding_mask,
            value_mask=padding_mask,
            use_causal_mask=use_causal_mask,
            return_attention_scores=scores,
            training=training,
        )

    def call(self, x, padding_mask=None, use_causal_mask=False, training=None):
        residual = x
        h = self.norm1(x) if self.normalize_first else x
        h = self._attend(h, padding_mask, use_causal_mask, training, False)
        x = residual + self.path_drop(
            self.drop(h, training=training), training=training
        )
        if not self.normalize_first:
            x = self.norm1(x)
        residual = x
        h = self.norm2(x) if self.normalize_first else x
        h = self.mlp_out(self.drop(self.mlp_in(h), training=training))
        x = residual + self.path_drop(
            self.drop(h, training=training), training=training
        )
        if not self.normalize_first:
            x = self.norm2(x)
        return x

    def attention_scores(self, x, padding_mask=None, use_causal_mask=False):
        """The block's attention weights `(B, N, T, T)` for inputs `x`."""
        h = self.norm1(x) if self.normalize_first else x
        _, scores = self._attend(h, padding_mask, use_causal_mask, False, True)
        return scores

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        attention = self.attention
        if not isinstance(attention, str):
            attention = keras.saving.serialize_keras_object(attention)
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "hidden_dim": self.hidden_dim,
            "attention": attention,
            "key_dim": self.key_dim,
            "beta": self.beta,
            "head_factors": self.head_factors,
            "num_prefix_tokens": self.num_prefix_tokens,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "drop_path": self.drop_path,
            "normalize_first": self.normalize_first,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }
