"""Vision transformer classifier with SVR attention (DeiT shape)."""

import keras

from keras_svr_attention.models.encoder import TransformerEncoderBlock
from keras_svr_attention.models.layers import ClassToken
from keras_svr_attention.models.layers import PositionEmbedding
from keras_svr_attention.models.layers import SelectToken

VIT_PRESETS = {
    # DeiT-tiny as the paper ran it (its Sections 3 and 5).
    "deit-tiny": dict(
        patch_size=16,
        width=192,
        depth=12,
        num_heads=4,
        mlp_dim=768,
        head_factors=[1, 1, 2, 4],
        beta=1.0,
        dropout=0.0,
        drop_path=0.1,
    ),
    # Trains on a CPU in minutes (8x8 digits: 2x2 patches, 16 + 1 tokens).
    "small": dict(
        patch_size=2,
        width=64,
        depth=4,
        num_heads=4,
        mlp_dim=128,
        head_factors=[1, 1, 2, 4],
        beta=1.0,
        dropout=0.1,
        drop_path=0.05,
    ),
}
"""`vit_classifier`'s presets: name -> keyword arguments (explicit arguments
override them). "deit-tiny" is the paper's ImageNet model; "small" suits
8x8 digits on a CPU."""


def vit_classifier(
    image_shape,
    num_classes,
    attention="softmax",
    preset="small",
    **overrides,
):
    """Builds a ViT: patches, CLS token, learned positions, blocks, head.

    Args:
        image_shape: `(height, width, channels)`.
        num_classes: int.
        attention: "softmax", "bn", "sh", "bn+sh" (see `presets.get`).
        preset: a key of `VIT_PRESETS`; `overrides` replace its entries
            (`patch_size`, `width`, `depth`, `num_heads`, `mlp_dim`,
            `head_factors`, `beta`, `dropout`, `drop_path`).

    The CLS token is a prefix token: SH never pools it.

    Returns:
        A `keras.Model` from images to logits.

    Example:
    ```python
    model = vit_classifier((32, 32, 3), 10, attention="bn+sh",
                           preset="small", patch_size=4)
    ```
    """
    if preset not in VIT_PRESETS:
        raise ValueError(
            f"`preset` must be one of {sorted(VIT_PRESETS)}. "
            f"Received: preset={preset!r}"
        )
    unknown = set(overrides) - set(VIT_PRESETS[preset])
    if unknown:
        raise ValueError(
            f"Unknown options {sorted(unknown)}; expected some of "
            f"{sorted(VIT_PRESETS[preset])}."
        )
    cfg = {**VIT_PRESETS[preset], **overrides}
    patch = cfg["patch_size"]
    if image_shape[0] % patch or image_shape[1] % patch:
        raise ValueError(
            f"`patch_size` must divide the image size {image_shape[:2]}. "
            f"Received: patch_size={patch}"
        )
    num_patches = (image_shape[0] // patch) * (image_shape[1] // patch)
    inputs = keras.Input(image_shape, name="images")
    x = keras.layers.Conv2D(
        cfg["width"], patch, strides=patch, name="patch_embedding"
    )(inputs)
    x = keras.layers.Reshape((num_patches, cfg["width"]))(x)
    x = ClassToken(name="cls_token")(x)
    x = PositionEmbedding(num_patches + 1, name="positions")(x)
    x = keras.layers.Dropout(cfg["dropout"])(x)
    for i in range(cfg["depth"]):
        x = TransformerEncoderBlock(
            num_heads=cfg["num_heads"],
            hidden_dim=cfg["mlp_dim"],
            attention=attention,
            beta=cfg["beta"],
            head_factors=cfg["head_factors"],
            num_prefix_tokens=1,
            dropout=cfg["dropout"],
            drop_path=cfg["drop_path"] * i / max(cfg["depth"] - 1, 1),
            name=f"block_{i}",
        )(x)
    x = keras.layers.LayerNormalization(epsilon=1e-6, name="norm")(x)
    x = SelectToken(0, name="cls")(x)
    outputs = keras.layers.Dense(num_classes, name="head")(x)
    return keras.Model(
        inputs,
        outputs,
        name=f"vit_{getattr(attention, 'name', attention).replace('+', '_')}",
    )
