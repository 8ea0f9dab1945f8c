"""What the example scripts share: options, checks, progress and results.

Nothing here imports Keras at module level, so `--help` works before any
backend is installed or chosen.
"""

import argparse
import csv
import functools
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


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def rate(text):
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def int_list(text):
    try:
        return [int(f) for f in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 1,1,2,2, got {text!r}"
        ) from None


def add_training_arguments(parser, epochs, batch_size, learning_rate, output):
    """The options both examples share, with each example's defaults."""
    arg = parser.add_argument
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
            ksa.get(
                name,
                num_heads,
                key_dim,
                **ksa.options_used_by(name, **options),
            )
        except ValueError as e:
            fail(f"--attention {name}: {str(e).splitlines()[0]}")
    return names


def progress(epochs):
    """`fit` arguments for the output: bars on a terminal, else plain lines.

    Redirected to a file, Keras's bars would write every update; instead
    one plain line per epoch (no ANSI codes) with the epoch's metrics.
    Either way the epochs are timed, in `EpochTimer.seconds`.
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


def slug(name):
    return name.replace("+", "_")


class Results:
    """Per-seed runs, their summary table, results files and plots.

    Each run's `history` comes from `fit` with the test set as
    `validation_data`, so `val_accuracy` is the test accuracy after each
    epoch. The headline is the final epoch's; the best epoch on the test
    set is reported beside it, labelled as the paper's protocol
    (mvts_transformer evaluates on the test set every epoch and the paper
    follows it).
    """

    def __init__(self, dataset, args):
        self.dataset, self.args, self.runs = dataset, args, []

    def add(self, attention, seed, history, **values):
        curve = [100 * a for a in history["val_accuracy"]]
        self.runs.append(
            {
                "attention": attention,
                "seed": seed,
                "test_accuracy": curve[-1],
                "best_epoch_test_accuracy": max(curve),
                "best_epoch": int(np.argmax(curve)) + 1,
                **values,
                "test_accuracy_per_epoch": curve,
            }
        )

    def summary(self):
        """One row per attention: mean and std over seeds."""
        rows = []
        for name in dict.fromkeys(r["attention"] for r in self.runs):
            runs = [r for r in self.runs if r["attention"] == name]
            row = {"attention": name, "seeds": len(runs)}
            for key, value in runs[0].items():
                if isinstance(value, (int, float)) and key != "seed":
                    values = [r[key] for r in runs]
                    row[key], row[key + "_std"] = (
                        np.mean(values),
                        np.std(values),
                    )
            rows.append(row)
        return rows

    def table(self):
        rows = self.summary()
        extra = [k for k in rows[0] if k.startswith("top") and "_std" not in k]
        head = [
            "attention",
            "test accuracy %, final epoch",
            *[f"{k} %" for k in extra],
            "best epoch % (paper's protocol: chosen on test)",
            "params",
            "train s",
            "head diversity",
        ]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            cell = functools.partial(_mean_std, r)
            cells = [
                r["attention"],
                cell("test_accuracy"),
                *[cell(k) for k in extra],
                cell("best_epoch_test_accuracy"),
                f"{int(r['params'])}",
                f"{r['train_seconds']:.1f}",
                cell("head_diversity", 3),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def write(self, output):
        """results.md, .json and .csv, curves.png and diversity.png."""
        from keras_svr_attention.diagnostics import plots

        os.makedirs(output, exist_ok=True)
        table = self.table()
        print(table)
        about = {
            "dataset": self.dataset,
            "hyperparameters": vars(self.args),
            **environment(),
        }
        with open(os.path.join(output, "results.md"), "w") as f:
            f.write(f"{self.dataset}\n\n{table}\n")
        with open(os.path.join(output, "results.json"), "w") as f:
            json.dump(
                {**about, "summary": self.summary(), "runs": self.runs},
                f,
                indent=1,
                default=float,
            )
        with open(os.path.join(output, "results.csv"), "w", newline="") as f:
            flat = {
                "dataset": self.dataset,
                "backend": about["backend"],
                **{f"{k} version": v for k, v in about["versions"].items()},
                **{
                    "--" + k.replace("_", "-"): _cell(v)
                    for k, v in vars(self.args).items()
                },
            }
            keys = [k for k in self.runs[0] if k != "test_accuracy_per_epoch"]
            writer = csv.DictWriter(f, fieldnames=[*keys, *flat])
            writer.writeheader()
            for run in self.runs:
                writer.writerow({**{k: run[k] for k in keys}, **flat})
        curves, diversity = {}, {}
        for run in self.runs:
            name = run["attention"]
            curves.setdefault(name, []).append(run["test_accuracy_per_epoch"])
            diversity.setdefault(name, []).append(run["head_diversity"])
        plots.plot_training_curves(
            curves,
            path=os.path.join(output, "curves.png"),
            title=f"{self.dataset}: test accuracy after each epoch",
        )
        plots.plot_head_diversity(
            diversity,
            path=os.path.join(output, "diversity.png"),
            title=f"{self.dataset}: head diversity of the trained models",
        )


def _mean_std(row, key, digits=2):
    return f"{row[key]:.{digits}f} ± {row[key + '_std']:.{digits}f}"


def _cell(value):
    return ",".join(map(str, value)) if isinstance(value, list) else value
