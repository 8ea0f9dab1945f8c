"""Encoder block, model builders and head diagnostics, on every backend."""

import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests.testing import assert_allclose

ATTENTIONS = ["softmax", "bn", "sh", "bn+sh"]


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


@pytest.mark.parametrize("attention", ATTENTIONS)
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
    # the paper's ImageNet run, and beta = 1.0 (SPEC.md section 5).
    model = ksa.vit_classifier((224, 224, 3), 1000, "bn+sh", "deit-tiny")
    assert round(model.count_params() / 1e5) == 57
    blocks = [layer for layer in model.layers if layer.name.startswith("block")]
    attention = [block.attention_layer for block in blocks]
    assert len(attention) == 12
    for layer in attention:
        assert layer.num_heads == 4 and layer.key_dim == 192 // 4
        assert layer.head_factors == (1, 1, 2, 4) and layer.beta == 1.0


@pytest.mark.parametrize("attention", ATTENTIONS)
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


def test_attention_maps_cover_every_block_and_head():
    model = ksa.timeseries_classifier(
        9, 3, 2, attention="bn+sh", width=16, depth=2
    )
    x = np.random.default_rng(0).normal(size=(5, 9, 3)).astype("float32")
    mask = np.arange(9)[None] < np.array([[9], [5], [9], [3], [7]])
    maps = ksa.attention_maps(model, [x, mask], batch_size=2)
    assert [m.shape for m in maps] == [(5, 8, 9, 9)] * 2
    sums = maps[0].sum(-1)  # (B, N, T)
    np.testing.assert_allclose(sums.transpose(0, 2, 1)[mask], 1.0, atol=1e-5)
    assert np.all(
        maps[0][~mask[:, None, None, :].repeat(8, 1).repeat(9, 2)] == 0
    )


def test_head_redundancy_matches_hand_computation():
    eye = np.eye(3)[None]  # one head attends to itself
    shift = np.roll(np.eye(3), 1, axis=1)[None]
    maps = np.stack([eye, eye, shift], axis=1)  # (1, 3, 3, 3)
    # Pairs: (eye, eye) -> 0, (eye, shift) -> sqrt(2) twice.
    want = (0 + 2 * np.sqrt(2)) / 3
    assert ksa.head_redundancy(maps) == pytest.approx(want)
    assert ksa.head_redundancy([maps, maps]) == pytest.approx(want)
    mask = np.array([[True, True, False]])
    assert ksa.head_redundancy(maps, mask) == pytest.approx(want)


def test_window_view_gives_pooled_heads_their_windows_weight():
    model = ksa.timeseries_classifier(
        10, 3, 2, attention="bn+sh", width=16, depth=1, num_heads=4,
        head_factors=[1, 2, 3, 4],
    )  # fmt: skip
    x = np.random.default_rng(1).normal(size=(3, 10, 3)).astype("float32")
    mask = np.arange(10)[None] < np.array([[10], [7], [4]])
    (shared,) = ksa.attention_maps(model, [x, mask])
    (window,) = ksa.attention_maps(model, [x, mask], pooled_view="window")
    # By hand: key j of a head pooling by r lies in window j // r, whose
    # weight is shared by the window's real steps.
    for b in range(3):
        for h, r in enumerate([1, 2, 3, 4]):
            for j in range(10):
                real = mask[b, (j // r) * r : (j // r + 1) * r].sum()
                want = shared[b, h, :, j] * (real if mask[b, j] else 0)
                np.testing.assert_allclose(window[b, h, :, j], want, atol=1e-6)
    # With whole windows of real keys, a head's rows sum to its factor.
    sums = window[0].sum(-1)  # (N, T), series 0 has no padding
    np.testing.assert_allclose(sums[:2], [[1.0] * 10, [2.0] * 10], rtol=1e-5)
    with pytest.raises(ValueError, match="pooled_view"):
        ksa.attention_maps(model, [x, mask], pooled_view="spread")


def test_attention_map_plot_is_readable_without_the_source(tmp_path):
    pytest.importorskip("matplotlib")
    from keras_svr_attention.diagnostics import plots

    rng = np.random.default_rng(0)
    maps = [rng.random((2, 3, 5, 5)) * s for s in (1.0, 0.5)]
    mask = np.array([[True] * 5, [True, True, True, False, False]])
    fig = plots.plot_attention_maps(
        maps,
        sample=1,
        padding_mask=mask,
        sample_name="test series 1",
        head_factors=[1, 2, 4],
        path=tmp_path / "maps.png",
    )
    panels, bars = fig.axes[:6], fig.axes[6:]
    assert len(bars) == 1  # one colorbar for all panels
    limits = {p.images[0].get_clim() for p in panels}
    assert limits == {(0.0, maps[0][1].max())}  # one shared scale
    assert all(p.get_xlabel() == "key step" for p in panels[3:])
    assert all(p.get_ylabel() == "query step" for p in panels[::3])
    assert panels[2].get_title() == "layer 0, head 2, r = 4"
    assert "test series 1" in fig._suptitle.get_text()
    assert "padding" in fig.legends[0].texts[0].get_text()
    assert (tmp_path / "maps.png").stat().st_size > 1000


def test_curve_and_diversity_plots_show_mean_and_spread(tmp_path):
    pytest.importorskip("matplotlib")
    from keras_svr_attention.diagnostics import plots

    curves = {"softmax": [[50, 70, 80], [60, 80, 90]], "bn": [[40, 60, 95]]}
    fig = plots.plot_training_curves(curves, path=tmp_path / "curves.png")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "test accuracy (%)" and ax.get_xlabel()
    assert ax.get_title()
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [55, 75, 85])
    assert len(ax.collections) == 2  # one band per attention
    fig = plots.plot_head_diversity(
        {"softmax": [0.2, 0.3], "sh": [0.25]}, path=tmp_path / "div.png"
    )
    ax = fig.axes[0]
    assert "diversity" in ax.get_title().lower()
    assert "less redundant" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().texts]
    assert "± std over seeds" in labels
    np.testing.assert_allclose(
        [bar.get_height() for bar in ax.patches], [0.25, 0.25]
    )
