"""Plots of attention maps, training curves and head redundancy.

matplotlib is imported inside the functions (an optional dependency).
"""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_attention_maps(maps, sample=0, path=None, title=None):
    """Grid of layers x heads of one sample's attention maps."""
    plt = _pyplot()
    rows, cols = len(maps), maps[0].shape[1]
    fig, axes = plt.subplots(
        rows, cols, figsize=(2 * cols, 2 * rows), squeeze=False
    )
    for layer, a in enumerate(maps):
        for head in range(cols):
            ax = axes[layer][head]
            ax.imshow(a[sample, head], cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"layer {layer} head {head}", fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def plot_training_curves(histories, path=None, metric="val_accuracy"):
    """One line per attention: `histories` maps name -> list of History."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, runs in histories.items():
        for i, history in enumerate(runs):
            values = history.get(metric) or history.get("accuracy")
            ax.plot(
                values,
                label=name if i == 0 else None,
                color=f"C{list(histories).index(name)}",
                alpha=0.8,
            )
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.legend()
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def plot_head_redundancy(values, path=None):
    """Bar chart of head redundancy: `values` maps name -> (mean, std)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = list(values)
    ax.bar(
        names,
        [values[n][0] for n in names],
        yerr=[values[n][1] for n in names],
        color="C0",
        capsize=4,
    )
    ax.set_ylabel("mean L2 distance between heads")
    ax.set_title("Head redundancy (higher = more diverse)")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig
