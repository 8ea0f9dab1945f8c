"""Shared by the example scripts: the comparison loop, table and plots."""

import contextlib
import csv
import json
import os
import time

import keras
import numpy as np

import keras_svr_attention as ksa
from keras_svr_attention.diagnostics import plots

ATTENTIONS = ["softmax", "bn", "sh", "bn+sh"]


def add_training_arguments(
    parser, epochs, batch_size, learning_rate, beta, output
):
    """The options both examples share, with each example's defaults."""
    parser.add_argument(
        "--attention",
        default="all",
        help="comma-separated names (softmax, bn, sh, bn+sh, linear, "
        "linear+bn+sh, sparse+bn, ...), or 'all' for softmax,bn,sh,bn+sh",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--learning-rate", type=float, default=learning_rate)
    parser.add_argument("--beta", type=float, default=beta)
    parser.add_argument(
        "--head-factors",
        default=None,
        help="comma-separated, one per head (default 1,1,2,2,4,4,...)",
    )
    parser.add_argument("--output", default=output)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="1 epoch, 1 seed, a few samples: checks the pipeline",
    )


def parse_attentions(value):
    names = ATTENTIONS if value == "all" else value.split(",")
    for name in names:
        if name not in ksa.layers.presets.available():
            raise SystemExit(
                f"error: unknown attention {name!r}; choose from "
                f"{ksa.layers.presets.available()} or 'all'"
            )
    return names


def parse_factors(value):
    return None if value is None else [int(f) for f in value.split(",")]


def run_comparison(
    build_model,
    train,
    test,
    attentions,
    seeds,
    epochs,
    batch_size,
    learning_rate,
    output_dir,
    redundancy_inputs,
    redundancy_mask=None,
    extra_metrics=(),
    weight_decay=0.05,
    verbose=1,
    loss=None,
    train_data=None,
    scope=contextlib.nullcontext,
):
    """Trains every attention for every seed; writes table, JSON and plots.

    `loss` defaults to sparse categorical cross-entropy on logits;
    `train_data(seed)`, when given, makes the training batches (a
    `keras.utils.PyDataset`) in place of shuffled `train` arrays. Each
    model is built and compiled inside `scope()` (a distribution strategy's
    scope, for one).
    Returns the list of result rows (one per attention).
    """
    loss = loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    os.makedirs(output_dir, exist_ok=True)
    rows, histories, redundancy = [], {}, {}
    for name in attentions:
        runs = []
        for seed in range(seeds):
            keras.utils.set_random_seed(seed)
            with scope():
                model = build_model(name)
                steps = epochs * int(np.ceil(len(train[1]) / batch_size))
                schedule = keras.optimizers.schedules.CosineDecay(
                    learning_rate, max(steps, 1), warmup_target=None
                )
                model.compile(
                    optimizer=keras.optimizers.AdamW(
                        schedule, weight_decay=weight_decay
                    ),
                    loss=loss,
                    metrics=[
                        "accuracy",
                        *[
                            type(m).from_config(m.get_config())
                            for m in extra_metrics
                        ],
                    ],
                )
            print(f"== {name}, seed {seed}: {model.count_params()} params")
            start = time.perf_counter()
            if train_data is None:
                data = {"x": train[0], "y": train[1], "batch_size": batch_size}
            else:
                data = {"x": train_data(seed)}
            history = model.fit(
                **data, validation_data=test, epochs=epochs, verbose=verbose
            )
            seconds = time.perf_counter() - start
            start = time.perf_counter()
            scores = model.evaluate(
                test[0], test[1], verbose=0, return_dict=True
            )
            eval_seconds = time.perf_counter() - start
            maps = ksa.attention_maps(
                getattr(model, "classifier", model), redundancy_inputs
            )
            runs.append(
                {
                    "accuracy": 100 * scores["accuracy"],
                    **{
                        m: 100 * scores[m]
                        for m in scores
                        if m not in ("loss", "accuracy")
                    },
                    "params": model.count_params(),
                    "train_seconds": seconds,
                    "test_samples_per_second": len(test[1]) / eval_seconds,
                    "redundancy": ksa.head_redundancy(maps, redundancy_mask),
                    "history": history.history,
                }
            )
            # The trained model, for examples/convert_pretrained.py.
            model.save(
                os.path.join(output_dir, f"{_slug(name)}_seed{seed}.keras")
            )
            if seed == 0:
                plots.plot_attention_maps(
                    maps,
                    path=os.path.join(output_dir, f"maps_{_slug(name)}.png"),
                    title=name,
                )
        histories[name] = [r.pop("history") for r in runs]
        row = {"attention": name, "seeds": seeds}
        for key in runs[0]:
            values = np.array([r[key] for r in runs], "float64")
            row[key] = float(values.mean())
            row[key + "_std"] = float(values.std())
        rows.append(row)
        redundancy[name] = (row["redundancy"], row["redundancy_std"])
    _write(rows, histories, redundancy, output_dir)
    return rows


def _slug(name):
    return name.replace("+", "_")


def format_table(rows):
    metric_keys = [
        k for k in rows[0] if k.startswith("top") and not k.endswith("_std")
    ]
    head = [
        "attention",
        "test accuracy %",
        *[f"{k} %" for k in metric_keys],
        "params",
        "train s",
        "test samples/s",
        "head redundancy",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["attention"],
            f"{r['accuracy']:.2f} ± {r['accuracy_std']:.2f}",
            *[f"{r[k]:.2f} ± {r[k + '_std']:.2f}" for k in metric_keys],
            f"{int(r['params'])}",
            f"{r['train_seconds']:.1f}",
            f"{r['test_samples_per_second']:.0f}",
            f"{r['redundancy']:.3f} ± {r['redundancy_std']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write(rows, histories, redundancy, output_dir):
    table = format_table(rows)
    print(table)
    with open(os.path.join(output_dir, "results.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(output_dir, "results.json"), "w") as f:
        json.dump(
            {"backend": keras.config.backend(), "rows": rows}, f, indent=2
        )
    with open(os.path.join(output_dir, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plots.plot_training_curves(
        histories, path=os.path.join(output_dir, "curves.png")
    )
    plots.plot_head_redundancy(
        redundancy, path=os.path.join(output_dir, "redundancy.png")
    )
