"""The encoder backbones people fine-tune convert exactly (options off)
or are refused naming the feature that blocks them. Tiny configs, no
preset download."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests.testing import assert_allclose
from tests.testing import covering_off_torch
from tests.testing import random_weights

keras_hub = pytest.importorskip("keras_hub")
models = keras_hub.models

TEXT = {"num_layers": 2, "num_heads": 4, "hidden_dim": 16}
IMAGE = {"image_shape": (16, 16, 3), "patch_size": 4, **TEXT}
# name: (build, leading tokens that SH never pools)
ENCODERS = {
    "vit": (lambda: models.ViTBackbone(mlp_dim=32, **IMAGE), 1),
    "deit": (lambda: models.DeiTBackbone(intermediate_dim=32, **IMAGE), 2),
    "roberta": (
        lambda: models.RobertaBackbone(
            vocabulary_size=40, intermediate_dim=32, **TEXT
        ),
        0,
    ),
    "xlm-roberta": (
        lambda: models.XLMRobertaBackbone(
            vocabulary_size=40, intermediate_dim=32, **TEXT
        ),
        0,
    ),
    "distil-bert": (
        lambda: models.DistilBertBackbone(
            vocabulary_size=40, intermediate_dim=32, **TEXT
        ),
        0,
    ),
    "albert": (
        lambda: models.AlbertBackbone(
            vocabulary_size=40, embedding_dim=8, intermediate_dim=32, **TEXT
        ),
        0,
    ),
    "electra": (
        lambda: models.ElectraBackbone(
            vocab_size=40, embedding_dim=8, intermediate_dim=32, **TEXT
        ),
        0,
    ),
}


def _inputs(backbone):
    rng = np.random.default_rng(0)
    names = [t.name for t in keras.tree.flatten(backbone.input)]
    if "images" in names or len(names) == 1:
        return rng.normal(size=(2, 16, 16, 3)).astype("float32")
    padding = np.ones((2, 10), bool)
    padding[1, 7:] = False
    values = {
        "token_ids": rng.integers(1, 40, (2, 10)).astype("int32"),
        "padding_mask": padding,
        "segment_ids": np.zeros((2, 10), "int32"),
    }
    return {name: values[name] for name in names}


def _outputs(model, x):
    return [ops.convert_to_numpy(t) for t in keras.tree.flatten(model(x))]


# Covering (suite, tests/testing.py): ViT (an image, a CLS token) and
# RoBERTa (text with padding); the other encoders on torch.
@pytest.mark.parametrize(
    "name", covering_off_torch(ENCODERS, ("vit", "roberta"))
)
def test_encoders_convert_exactly_and_bn_sh_changes_them(name):
    build, prefix = ENCODERS[name]
    backbone = build()
    random_weights(backbone, seed=2)
    x = _inputs(backbone)
    want = _outputs(backbone, x)
    same = ksa.replace_attention(backbone, "softmax")
    converted = [
        layer
        for layer in same._flatten_layers()
        if isinstance(layer, ksa.SVRAttention)
    ]
    assert len(converted) == (1 if name == "albert" else 2)  # ALBERT shares
    valid = x["padding_mask"] if isinstance(x, dict) else np.ones((2, 1), bool)
    for got, expected in zip(_outputs(same, x), want, strict=True):
        if got.ndim == 3 and isinstance(x, dict):  # padded positions aside
            got, expected = got[valid], expected[valid]
        assert_allclose(got, expected, 1e-5, 1e-5)
    svr = ksa.replace_attention(
        backbone, "bn+sh", head_factors=[1, 1, 2, 2], num_prefix_tokens=prefix
    )
    changed = _outputs(svr, x)
    assert all(np.isfinite(t).all() for t in changed)
    assert (
        max(np.abs(a - b).max() for a, b in zip(changed, want, strict=True))
        > 1e-4
    )


@pytest.mark.parametrize(
    "name,build,feature",
    [
        (
            "deberta-v3",
            lambda: models.DebertaV3Backbone(
                vocabulary_size=40, intermediate_dim=32, **TEXT
            ),
            "disentangled attention",
        ),
        (
            "t5",
            lambda: models.T5Backbone(
                vocabulary_size=40, intermediate_dim=32, **TEXT
            ),
            "relative position bias",
        ),
    ],
)
def test_models_with_attention_of_their_own_are_refused_naming_it(
    name, build, feature
):
    with pytest.raises(ValueError, match=feature):
        ksa.replace_attention(build(), "bn+sh")
