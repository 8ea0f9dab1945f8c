"""Encoder block and model builders, on every backend."""

import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests.testing import assert_allclose
from tests.testing import covering_off_torch

ATTENTIONS = ["softmax", "bn", "sh", "bn+sh"]
# The example classifiers: BN+SH covers (suite, tests/testing.py).
CLASSIFIER_ATTENTIONS = covering_off_torch(ATTENTIONS, ("bn+sh",))


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_encoder_block_ignores_padded_steps(attention):
    block = ksa.TransformerEncoderBlock(
        num_heads=4,
        hidden_dim=16,
        attention=attention,
        head_factors=[1, 1, 2, 3] if "sh" in attention else None,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 7, 8)).astype("float32")
    mask = np.arange(7)[None] < np.array([[7], [4]])
    a = ops.convert_to_numpy(block(x, padding_mask=mask))
    x2 = x.copy()
    x2[1, 4:] = 50.0
    b = ops.convert_to_numpy(block(x2, padding_mask=mask))
    assert_allclose(a[mask], b[mask])


def test_encoder_block_takes_a_configured_layer_and_round_trips():
    layer = ksa.AttentionBNSH(num_heads=2, key_dim=4, head_factors=[1, 2])
    block = ksa.TransformerEncoderBlock(2, 16, attention=layer)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    y = block(x)
    assert block.attention_layer is layer
    clone = ksa.TransformerEncoderBlock.from_config(block.get_config())
    clone(x)
    clone.set_weights(block.get_weights())
    assert_allclose(clone(x), y)
    assert isinstance(clone.attention_layer, ksa.AttentionBNSH)


def test_encoder_block_rejects_unknown_attention():
    with pytest.raises(ValueError, match="`attention`"):
        ksa.TransformerEncoderBlock(2, 16, attention="cosine")
    with pytest.raises(ValueError, match="`head_factors`"):
        ksa.TransformerEncoderBlock(
            2, 16, attention="sh", head_factors=[1, 2, 4]
        )


def test_stochastic_depth_drops_whole_samples():
    layer = ksa.StochasticDepth(0.5, seed=0)
    x = np.ones((4000, 3, 2), "float32")
    y = ops.convert_to_numpy(layer(x, training=True))
    per_sample = y.reshape(4000, -1)
    assert set(np.unique(per_sample)) <= {0.0, 2.0}
    assert (per_sample == per_sample[:, :1]).all()  # all or nothing
    assert abs(per_sample.mean() - 1.0) < 0.1
    assert_allclose(layer(x, training=False), x)


@pytest.mark.parametrize("attention", CLASSIFIER_ATTENTIONS)
def test_vit_classifier_shapes_and_prefix_token(attention, tmp_path):
    model = ksa.vit_classifier((8, 8, 1), 10, attention=attention, depth=2)
    x = np.random.default_rng(0).random((3, 8, 8, 1)).astype("float32")
    logits = model.predict(x, verbose=0)
    assert logits.shape == (3, 10)
    blocks = [
        layer
        for layer in model.layers
        if isinstance(layer, ksa.TransformerEncoderBlock)
    ]
    assert len(blocks) == 2
    assert all(b.attention_layer.num_prefix_tokens == 1 for b in blocks)
    path = os.path.join(tmp_path, "vit.keras")
    model.save(path)
    assert_allclose(
        keras.saving.load_model(path).predict(x, verbose=0),
        logits,
        atol=1e-6,
        rtol=1e-6,
    )


def test_vit_classifier_rejects_bad_options():
    with pytest.raises(ValueError, match="`preset`"):
        ksa.vit_classifier((8, 8, 1), 10, preset="huge")
    with pytest.raises(ValueError, match="`patch_size`"):
        ksa.vit_classifier((8, 8, 1), 10, patch_size=3)
    with pytest.raises(ValueError, match="widht"):
        ksa.vit_classifier((8, 8, 1), 10, widht=3)


def test_deit_tiny_preset_builds_the_papers_model():
    # DeiT-tiny (Touvron et al. 2021): 5.7M parameters at 224 x 224 with
    # 1000 classes; 12 blocks of 4 heads over width 192. The SH factors of
    # the paper's ImageNet run, and beta = 1.0 (the paper, Appendix).
    model = ksa.vit_classifier((224, 224, 3), 1000, "bn+sh", "deit-tiny")
    assert round(model.count_params() / 1e5) == 57
    blocks = [layer for layer in model.layers if layer.name.startswith("block")]
    attention = [block.attention_layer for block in blocks]
    assert len(attention) == 12
    for layer in attention:
        assert layer.num_heads == 4 and layer.key_dim == 192 // 4
        assert layer.head_factors == (1, 1, 2, 4) and layer.beta == 1.0


@pytest.mark.parametrize("attention", CLASSIFIER_ATTENTIONS)
def test_timeseries_classifier_ignores_padding(attention):
    model = ksa.timeseries_classifier(
        11, 3, 4, attention=attention, width=16, depth=1
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 11, 3)).astype("float32")
    mask = np.arange(11)[None] < np.array([[11], [6]])
    a = model.predict([x, mask], verbose=0)
    x[1, 6:] = 9.0
    assert_allclose(model.predict([x, mask], verbose=0), a)
    assert a.shape == (2, 4)
