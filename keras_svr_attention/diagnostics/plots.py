"""Plots of attention maps, training curves and head diversity.

matplotlib is imported inside the functions (an optional dependency). Each
function returns the figure and, with `path`, saves it as a PNG.
"""

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt, fig, path):
    if path:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return fig


def plot_attention_maps(
    maps,
    sample=0,
    padding_mask=None,
    sample_name=None,
    head_factors=None,
    path=None,
    title=None,
):
    """One sample's attention maps: a grid of layers (rows) x heads.

    Every panel shares one colour scale, from 0 to the largest weight of
    the sample, shown by one colorbar. Padded steps (`padding_mask` False)
    are shaded grey on both axes.

    Args:
        maps: list (one per layer) of arrays `(B, N, T, S)`, as
            `attention_maps` returns.
        sample: int. Which of the B samples. Defaults to 0.
        padding_mask: `(B, T)` boolean or None. True on real steps.
        sample_name: str or None. Names the sample in the title, for
            example "test series 0 (class 3)". Defaults to
            "sample {sample}".
        head_factors: list of ints or None. SH factors, shown per head.
        path: where to save the PNG, or None.
        title: str or None. Put before the sample's name.
    """
    plt = _pyplot()
    from matplotlib.patches import Patch

    rows, cols = len(maps), maps[0].shape[1]
    top = max(float(np.max(a[sample])) for a in maps) or 1.0
    fig, axes = plt.subplots(
        rows, cols, figsize=(1.9 * cols + 1, 1.9 * rows + 0.9), squeeze=False
    )
    valid = None if padding_mask is None else np.asarray(padding_mask)[sample]
    for layer, a in enumerate(maps):
        for head in range(cols):
            ax = axes[layer][head]
            image = ax.imshow(
                a[sample, head], cmap="viridis", vmin=0.0, vmax=top
            )
            if valid is not None and not valid.all():
                for step in np.flatnonzero(~valid):
                    for span in (ax.axhspan, ax.axvspan):
                        span(step - 0.5, step + 0.5, color="0.6", lw=0)
            factor = f", r = {head_factors[head]}" if head_factors else ""
            ax.set_title(f"layer {layer}, head {head}{factor}", fontsize=7)
            ax.tick_params(labelsize=6)
            if head == 0:
                ax.set_ylabel("query step", fontsize=7)
            if layer == rows - 1:
                ax.set_xlabel("key step", fontsize=7)
    fig.colorbar(
        image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight"
    )
    name = sample_name or f"sample {sample}"
    fig.suptitle(f"{title}: {name}" if title else name)
    if valid is not None and not valid.all():
        fig.legend(
            handles=[Patch(color="0.6", label="padding (masked steps)")],
            loc="lower left",
            fontsize=7,
        )
    return _finish(plt, fig, path)


def plot_training_curves(
    curves, path=None, title=None, ylabel="test accuracy (%)"
):
    """Mean ± one standard deviation over seeds, one line per attention.

    Args:
        curves: dict, attention name -> list (one per seed) of per-epoch
            values.
        path: where to save the PNG, or None.
        title: str or None.
        ylabel: str. What the values are. Defaults to "test accuracy (%)".
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for index, (name, runs) in enumerate(curves.items()):
        length = min(len(r) for r in runs)
        values = np.array([r[:length] for r in runs], "float64")
        mean, std = values.mean(0), values.std(0)
        epochs = np.arange(1, length + 1)
        color = f"C{index}"
        ax.plot(epochs, mean, color=color, label=f"{name} ({len(runs)} seeds)")
        ax.fill_between(epochs, mean - std, mean + std, color=color, alpha=0.2)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title or f"{ylabel} per epoch (mean ± std over seeds)")
    ax.legend(title="line: mean, band: ± std", fontsize=8, title_fontsize=8)
    ax.grid(alpha=0.3)
    return _finish(plt, fig, path)


def plot_head_diversity(values, path=None, title=None):
    """Bar per attention of head diversity, with ± std error bars.

    Head diversity is `head_redundancy`'s value: the mean L2 distance
    between the attention maps of different heads. Higher means the heads
    attend differently, i.e. less redundant heads.

    Args:
        values: dict, attention name -> list of values (one per seed).
        path: where to save the PNG, or None.
        title: str or None. The title's first line; the second says that
            higher means less redundant.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    names = list(values)
    means = [np.mean(values[n]) for n in names]
    stds = [np.std(values[n]) for n in names]
    ax.bar(names, means, color="C0", label="mean over seeds")
    ax.errorbar(
        names,
        means,
        yerr=stds,
        fmt="none",
        ecolor="black",
        capsize=4,
        label="± std over seeds",
    )
    ax.set_xlabel("attention")
    ax.set_ylabel("mean L2 distance between heads' maps")
    ax.set_title(
        f"{title or 'Head diversity'}\n(higher = heads attend differently: "
        "less redundant)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _finish(plt, fig, path)
