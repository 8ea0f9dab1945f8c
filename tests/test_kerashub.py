"""KerasHub backbones converted to SVR attention (the `[hub]` extra).

Tiny backbones built from config: no preset download. BERT and ViT hold
`keras.layers.MultiHeadAttention` inside their encoder layers; GPT-2 holds
`CachedMultiHeadAttention` and decodes with a cache.
"""

import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests.testing import assert_allclose
from tests.testing import random_weights

keras_hub = pytest.importorskip("keras_hub")


def _attention(model):
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if type(layer).__name__.endswith("MultiHeadAttention")
        or isinstance(layer, ksa.SVRAttention)
    ]


def _bert():
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=30,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=12,
        dropout=0.0,
    )
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": rng.integers(0, 30, (2, 12)).astype("int32"),
        "segment_ids": np.zeros((2, 12), "int32"),
        "padding_mask": np.arange(12)[None] < np.array([[12], [7]]),
    }
    return backbone, inputs, "sequence_output"


def _vit():
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(16, 16, 3),
        patch_size=4,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        mlp_dim=32,
    )
    images = np.random.default_rng(1).normal(size=(2, 16, 16, 3))
    return backbone, images.astype("float32"), None


def _output(model, inputs, key):
    out = model(inputs)
    return out[key] if key else out


@pytest.mark.parametrize("build", [_bert, _vit], ids=["bert", "vit"])
def test_backbone_conversion(build):
    backbone, inputs, key = build()
    random_weights(backbone)
    want = _output(backbone, inputs, key)
    same = ksa.replace_attention(backbone, "softmax")
    assert all(isinstance(a, ksa.SVRAttention) for a in _attention(same))
    assert len(_attention(same)) == 2
    assert_allclose(_output(same, inputs, key), want, 1e-5, 1e-5)
    # The CLS token of ViT is a prefix token: SH never pools it.
    prefix = 1 if build is _vit else 0
    new = ksa.replace_attention(
        backbone, "bn+sh", head_factors=[1, 1, 2, 4], num_prefix_tokens=prefix
    )
    got = ops.convert_to_numpy(_output(new, inputs, key))
    assert np.all(np.isfinite(got))
    assert np.abs(got - ops.convert_to_numpy(want)).max() > 1e-4
    assert len(new.weights) == len(backbone.weights)
    assert all(
        type(a).__name__ == "MultiHeadAttention" for a in _attention(backbone)
    )


def _gpt2_lm():
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=50,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
        dropout=0.0,
    )
    random_weights(backbone, seed=3)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


@pytest.mark.parametrize(
    "attention,options",
    [
        ("softmax", {}),
        ("bn", {}),
        ("sh", {"head_factors": [1, 1, 2, 4]}),
        ("bn+sh", {"head_factors": [1, 2, 2, 4]}),
    ],
)
def test_gpt2_generates_with_a_cache_as_the_full_forward(attention, options):
    lm = _gpt2_lm()
    new = ksa.replace_attention(lm, attention, **options)
    length, prompt = 12, 3
    tokens = np.zeros((2, length), "int32")
    tokens[:, :prompt] = [[5, 7, 9], [1, 2, 3]]
    padding = np.ones((2, length), bool)
    _, cache = new._build_cache(ops.convert_to_tensor(tokens))
    for t in range(prompt, length):
        logits, _, cache = new.call_with_cache(
            ops.convert_to_tensor(tokens[:, t - 1 : t]), cache, t - 1
        )
        full = new({"token_ids": tokens, "padding_mask": padding})
        step = ops.convert_to_numpy(logits)[:, 0]
        assert_allclose(step, ops.convert_to_numpy(full)[:, t - 1], 1e-4, 1e-4)
        tokens[:, t] = step.argmax(-1)
        # The same greedy token from the recomputed forward.
        np.testing.assert_array_equal(
            ops.convert_to_numpy(full)[:, t - 1].argmax(-1), tokens[:, t]
        )
    if attention != "softmax":
        before = lm({"token_ids": tokens, "padding_mask": padding})
        after = new({"token_ids": tokens, "padding_mask": padding})
        diff = ops.convert_to_numpy(after) - ops.convert_to_numpy(before)
        assert np.abs(diff).max() > 1e-4
