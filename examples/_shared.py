"""What the example scripts share: options, checks, progress, results files.

A reader can skip this module: each script says in its prose what it uses
from here. Nothing here imports Keras at module level, so `--help` works
before any backend is installed or chosen. The scripts import it by name:
Python puts a script's own folder on `sys.path`.
"""

import argparse
import csv
import json
import os
import platform
import sys
import time
from importlib import metadata

import numpy as np

ATTENTIONS = ["softmax", "bn", "sh", "bn+sh"]


class HelpFormatter(
    argparse.ArgumentDefaultsHelpFormatter,
    argparse.RawDescriptionHelpFormatter,
):
    """Shows every option's default; keeps the description's layout."""


def fail(message):
    """Prints a one-line error and exits with code 2, as argparse does."""
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _checked(convert, test, expected):
    def parse(text):
        value = convert(text)
        if not test(value):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text}")
        return value

    return parse


positive_int = _checked(int, lambda v: v >= 1, ">= 1")
positive_float = _checked(float, lambda v: v > 0, "> 0")
rate = _checked(float, lambda v: 0 <= v < 1, "in [0, 1)")


def int_list(text):
    try:
        return [int(f) for f in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 1,1,2,2, got {text!r}"
        ) from None


def parser(description, *, epochs, batch_size, learning_rate, output):
    """An argument parser with the options every example shares."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=HelpFormatter
    )
    arg = p.add_argument
    arg(
        "--attention",
        default="all",
        help="comma-separated attention names (softmax, bn, sh, bn+sh, "
        "linear, linear+bn+sh, sparse+bn, ...), or 'all' for "
        + ",".join(ATTENTIONS),
    )
    arg("--seeds", type=positive_int, default=3, help="runs per attention")
    arg("--epochs", type=positive_int, default=epochs, help="training epochs")
    arg("--batch-size", type=positive_int, default=batch_size, help="batch")
    arg(
        "--learning-rate",
        type=positive_float,
        default=learning_rate,
        help="AdamW's peak rate (cosine decay to 0)",
    )
    arg(
        "--head-factors",
        type=int_list,
        default=None,
        help="SH pooling factor of each head, comma-separated, one per head "
        "(default 1,1,2,2,4,4,... = 2^(h//2))",
    )
    arg("--output", default=output, help="folder for results and plots")
    arg(
        "--smoke",
        action="store_true",
        help="1 epoch, 1 seed, a few samples: checks the pipeline",
    )
    return p


def parse_args(parser):
    """The parsed options; `--smoke` sets 1 epoch and 1 seed."""
    args = parser.parse_args()
    if args.smoke:
        args.epochs, args.seeds = 1, 1
    return args


def import_keras():
    """Imports Keras, or exits with one line if its backend is missing."""
    try:
        import keras
    except ImportError as e:
        fail(
            f"Keras cannot load its backend ({e}). Install one, e.g. "
            "pip install -e '.[jax]', and set KERAS_BACKEND=jax (or "
            "tensorflow, torch)"
        )
    return keras


def check_attentions(value, num_heads, key_dim, **options):
    """The attention names of `--attention`, each built once to check it.

    Exits with a one-line error naming the attention and the option when
    a name is unknown or an option does not fit it (for example head
    factors that do not match the number of heads).
    """
    import keras_svr_attention as ksa

    names = ATTENTIONS if value == "all" else value.split(",")
    options = {k: v for k, v in options.items() if v is not None}
    for name in names:
        try:
            used = ksa.options_used_by(name, **options)
            ksa.get(name, num_heads, key_dim, **used)
        except ValueError as e:
            fail(f"--attention {name}: {str(e).splitlines()[0]}")
    return names


def slug(attention):
    """The attention's name in file names: bn+sh -> bn_sh."""
    return attention.replace("+", "_")


def smoke_subset(count, *splits):
    """`count` random rows of each split (a tuple of equally long arrays)."""
    pick = np.random.default_rng(0).permutation
    subsets = []
    for arrays in splits:
        rows = pick(len(arrays[0]))[:count]
        subsets.append(tuple(a[rows] for a in arrays))
    return subsets


def load_images(name):
    """(x_train, y_train), (x_test, y_test), classes: images in [0, 1].

    "digits" is scikit-learn's 8x8 digits (stratified 80/20 split, offline);
    "mnist", "cifar10" and "cifar100" come through `keras.datasets`, which
    downloads them once (a one-line error when it cannot).
    """
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x = (digits.images / 16.0).astype("float32")[..., None]
        x_train, x_test, y_train, y_test = train_test_split(
            x, digits.target, test_size=0.2, random_state=0,
            stratify=digits.target,
        )  # fmt: skip
        return (x_train, y_train), (x_test, y_test), 10
    keras = import_keras()
    try:
        train, test = getattr(keras.datasets, name).load_data()
    except Exception as e:  # no network: URLError, OSError, ...
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail(
            f"--dataset {name} is downloaded by keras.datasets and the "
            f"download failed (offline?): {reason[:120]}. --dataset digits "
            "works offline"
        )

    def scaled(x, y):
        x = x[..., None] if x.ndim == 3 else x
        return x.astype("float32") / 255.0, y.reshape(-1)

    return scaled(*train), scaled(*test), 100 if name == "cifar100" else 10


def adamw(learning_rate, total_steps):
    """AdamW (weight decay 0.05) with cosine decay to 0 over the run."""
    import keras

    return keras.optimizers.AdamW(
        keras.optimizers.schedules.CosineDecay(learning_rate, total_steps),
        weight_decay=0.05,
    )


def progress(epochs):
    """`fit` arguments for the output: bars on a terminal, else plain lines.

    Redirected to a file, Keras's bars would write every update; instead
    one plain line per epoch (no ANSI codes) with the epoch's metrics.
    Either way the epochs are timed, in `timer.seconds`.
    """
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self, plain):
            super().__init__()
            self.plain, self.seconds = plain, []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)
            if self.plain:
                values = "  ".join(
                    f"{k.replace('val_', 'test_')} {v:.4f}"
                    for k, v in (logs or {}).items()
                )
                print(
                    f"  epoch {epoch + 1}/{epochs}  {values}  "
                    f"({self.seconds[-1]:.1f} s)",
                    flush=True,
                )

    terminal = sys.stdout.isatty()
    timer = EpochTimer(plain=not terminal)
    return {"verbose": 1 if terminal else 0, "callbacks": [timer]}, timer


def record(attention, seed, history, **values):
    """One run's results from its `fit` history and other `values`.

    `fit` had the test set as `validation_data`, so `val_accuracy` is the
    test accuracy after each epoch. The headline is the final epoch's; the
    best epoch on the test set is kept beside it, labelled as the paper's
    protocol (mvts_transformer evaluates on the test set every epoch and
    the paper follows it).
    """
    curve = [100 * a for a in history["val_accuracy"]]
    return {
        "attention": attention,
        "seed": seed,
        "test_accuracy": curve[-1],
        "best_epoch_test_accuracy": max(curve),
        "best_epoch": int(np.argmax(curve)) + 1,
        **values,
        "test_accuracy_per_epoch": curve,
    }


def summarize(runs):
    """One row per attention: the mean and std over seeds of each number."""
    rows = []
    for name in dict.fromkeys(r["attention"] for r in runs):
        same = [r for r in runs if r["attention"] == name]
        row = {"attention": name, "seeds": len(same)}
        for key, value in same[0].items():
            if isinstance(value, (int, float)) and key != "seed":
                values = [r[key] for r in same]
                row[key], row[key + "_std"] = np.mean(values), np.std(values)
        rows.append(row)
    return rows


# The table's columns: (key in a summary row, heading, digits, with std).
COLUMNS = [
    ("test_accuracy", "test accuracy %, final epoch", 2, True),
    ("top5", "top5 %", 2, True),
    ("best_epoch_test_accuracy",
     "best epoch % (paper's protocol: chosen on test)", 2, True),
    ("params", "params", 0, False),
    ("train_seconds", "train s", 1, False),
    ("head_diversity", "head diversity", 3, True),
]  # fmt: skip


def markdown_table(rows):
    """The summary as a Markdown table (columns the runs have)."""
    columns = [c for c in COLUMNS if c[0] in rows[0]]
    lines = [
        "| attention | " + " | ".join(c[1] for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for r in rows:
        cells = [
            f"{r[k]:.{d}f}" + (f" ± {r[k + '_std']:.{d}f}" if std else "")
            for k, _, d, std in columns
        ]
        lines.append(f"| {r['attention']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment():
    """The backend and the versions a result depends on."""
    import keras

    backend = keras.config.backend()
    versions = {"python": platform.python_version()}
    for name in ("keras", "keras-svr-attention", "numpy", backend):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    if versions.get("tensorflow") is None and backend == "tensorflow":
        versions["tensorflow"] = metadata.version("tensorflow-cpu")
    return {"backend": backend, "versions": versions}


def write_results(output, dataset, args, runs):
    """Prints the table; writes results.md, .json, .csv, curves.png and
    diversity.png (test accuracy per epoch, head diversity) to `output`."""
    from keras_svr_attention.diagnostics import plots

    os.makedirs(output, exist_ok=True)
    summary = summarize(runs)
    table = markdown_table(summary)
    print(table)
    about = {"dataset": dataset, "hyperparameters": vars(args), **environment()}
    with open(os.path.join(output, "results.md"), "w") as f:
        f.write(f"{dataset}\n\n{table}\n")
    with open(os.path.join(output, "results.json"), "w") as f:
        json.dump(
            {**about, "summary": summary, "runs": runs},
            f,
            indent=1,
            default=float,
        )
    setting = {
        "dataset": dataset,
        "backend": about["backend"],
        **{f"{k} version": v for k, v in about["versions"].items()},
        **{
            "--" + k.replace("_", "-"): (
                ",".join(map(str, v)) if isinstance(v, list) else v
            )
            for k, v in vars(args).items()
        },
    }
    keys = [k for k in runs[0] if k != "test_accuracy_per_epoch"]
    with open(os.path.join(output, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*keys, *setting])
        writer.writeheader()
        for run in runs:
            writer.writerow({**{k: run[k] for k in keys}, **setting})
    curves, diversity = {}, {}
    for run in runs:
        name = run["attention"]
        curves.setdefault(name, []).append(run["test_accuracy_per_epoch"])
        diversity.setdefault(name, []).append(run["head_diversity"])
    plots.plot_training_curves(
        curves,
        path=os.path.join(output, "curves.png"),
        title=f"{dataset}: test accuracy after each epoch",
    )
    plots.plot_head_diversity(
        diversity,
        path=os.path.join(output, "diversity.png"),
        title=f"{dataset}: head diversity of the trained models",
    )


def attention_diagnostics(
    model, sample, attention, seed, output, sample_name, padding_mask=None
):
    """The head diversity of `model`'s attention maps on `sample`; for seed
    0 also plots the first sample's maps to maps_<attention>.png."""
    import keras_svr_attention as ksa
    from keras_svr_attention.diagnostics import plots

    maps = ksa.attention_maps(model, sample)
    if seed == 0:
        os.makedirs(output, exist_ok=True)
        plots.plot_attention_maps(
            maps,
            padding_mask=padding_mask,
            sample_name=sample_name,
            head_factors=model.get_layer(
                "block_0"
            ).attention_layer.head_factors,
            title=f"{attention} attention, seed 0",
            path=os.path.join(output, f"maps_{slug(attention)}.png"),
        )
    return ksa.head_redundancy(maps, padding_mask)
