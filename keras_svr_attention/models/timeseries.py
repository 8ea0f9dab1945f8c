"""Time-series classifier with SVR attention (mvts_transformer shape)."""

import keras

from keras_svr_attention.layers.presets import default_head_factors
from keras_svr_attention.models.encoder import TransformerEncoderBlock
from keras_svr_attention.models.layers import PositionEmbedding


def timeseries_classifier(
    max_length,
    num_features,
    num_classes,
    attention="softmax",
    width=64,
    depth=3,
    num_heads=8,
    mlp_dim=256,
    head_factors=None,
    beta=0.6,
    dropout=0.1,
    drop_path=0.0,
    input_noise=0.0,
):
    """Builds an mvts_transformer-style classifier for variable-length series.

    Inputs are `series` `(B, max_length, num_features)` and `padding_mask`
    `(B, max_length)` (True for real steps): padded steps are masked in every
    attention and left out of the pooled head. Input projection, learned
    positions, pre-LN encoder blocks, mean over the real steps
    (`GlobalAveragePooling1D` with the mask), dense head.

    Args:
        max_length: int. Time steps per (padded) series.
        num_features: int. Channels per time step.
        num_classes: int. Output logits.
        attention: "softmax", "bn", "sh", "bn+sh" (see `presets.get`).
        width: int. Model width.
        depth: int. Number of blocks.
        num_heads: int. Defaults to 8.
        head_factors: SH factors; defaults to 1, 1, 2, 2, 4, 4, 8, 8.
        beta: float. BN recentering weight (paper: 0.6 on JapaneseVowels).
        dropout: float. Dropout rate.
        drop_path: float. Stochastic depth rate.
        input_noise: float. Std of Gaussian noise added to the (padded,
            standardized) inputs in training, a cheap augmentation.

    Returns:
        A `keras.Model` `[series, padding_mask] -> logits`.

    Example:
    ```python
    model = timeseries_classifier(29, 12, 9, attention="bn+sh")
    ```
    """
    if head_factors is None:
        head_factors = default_head_factors(num_heads)
    series = keras.Input((max_length, num_features), name="series")
    mask = keras.Input((max_length,), dtype="bool", name="padding_mask")
    x = series
    if input_noise:
        x = keras.layers.GaussianNoise(input_noise, name="noise")(x)
    x = keras.layers.Dense(width, name="input_projection")(x)
    x = PositionEmbedding(max_length, name="positions")(x)
    x = keras.layers.Dropout(dropout)(x)
    for i in range(depth):
        x = TransformerEncoderBlock(
            num_heads=num_heads,
            hidden_dim=mlp_dim,
            attention=attention,
            beta=beta,
            head_factors=head_factors,
            dropout=dropout,
            drop_path=drop_path,
            name=f"block_{i}",
        )(x, padding_mask=mask)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="norm")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x, mask=mask)
    x = keras.layers.Dropout(dropout)(x)
    outputs = keras.layers.Dense(num_classes, name="head")(x)
    return keras.Model(
        [series, mask],
        outputs,
        name=f"ts_{getattr(attention, 'name', attention).replace('+', '_')}",
    )
