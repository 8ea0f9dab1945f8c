"""The diagnostic plots (`diagnostics.plots`): readable, labelled."""

import numpy as np
import pytest


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
