"""Softmax vs BN vs SH vs BN+SH on every classification set aeon ships.

An honest comparison, runnable offline and resumable:

1. Data: each set's own train/test split as aeon ships it, through
   `keras_svr_attention.datasets.load_uea`: padded and masked, series
   longer than `--max-length` steps averaged over non-overlapping patches
   of ceil(length / max_length) steps (the same for every attention),
   channels standardized with train-set statistics.
2. Tuning, on the training set only: a stratified 25% of it is held out
   for validation. `--candidates` hyperparameter sets (width, depth,
   dropout, input noise, learning rate, epochs, beta) are drawn once, with
   a fixed seed, from `SPACE`; every attention trains on every candidate
   (seed 0) and keeps the one with the best final-epoch validation
   accuracy (ties: lower validation loss). Same candidates, same budget for
   each attention; beta only matters to the BN variants.
3. Test: the chosen candidate is retrained on the whole training set for
   `--seeds` seeds. Reported: the final model's test accuracy (the honest
   number) and, labelled as the paper's protocol, the best test accuracy
   over the epochs (mvts_transformer evaluates on the test set every epoch
   and the paper follows it).
4. Paired test: the Wilcoxon signed-rank test of each variant against
   softmax over every (dataset, seed) pair, and aeon's critical-difference
   diagram over the datasets' mean accuracies.

Every run is cached as one JSON file under `--output`/runs and skipped when
present, so an interrupted suite resumes where it stopped; `--report`
writes the tables and plots from whatever the cache holds.

    KERAS_BACKEND=jax python benchmarks/offline_suite.py
    KERAS_BACKEND=jax python benchmarks/offline_suite.py --report
"""

import argparse
import json
import math
import os
import time
from typing import NamedTuple

import numpy as np

ATTENTIONS = ["softmax", "bn", "sh", "bn+sh"]
# The classification sets inside aeon's package (aeon 1.x): no download.
DATASETS = [
    "JapaneseVowels",
    "BasicMotions",
    "ArrowHead",
    "GunPoint",
    "ItalyPowerDemand",
    "OSULeaf",
    "PickupGestureWiimoteZ",
    "ACSF1",
    "UnitTest",
    "Covid3Month_disc",
]
SPACE = {
    "width": [32, 64],
    "depth": [1, 2],
    "dropout": [0.1, 0.2, 0.3],
    "input_noise": [0.0, 0.1, 0.2],
    "learning_rate": [1e-3, 3e-3],
    "epochs": [40, 80],
    "beta": [0.3, 0.6, 1.0],
}
NUM_HEADS = 8


class Split(NamedTuple):
    """One split of a set: series `(N, T, C)`, masks of their real steps
    `(N, T)` and class indices `(N,)`."""

    x: np.ndarray
    mask: np.ndarray
    y: np.ndarray

    def take(self, rows):
        return Split(self.x[rows], self.mask[rows], self.y[rows])


class RunKey(NamedTuple):
    """One run: a tuning candidate (`phase="tune"`, `index` = candidate)
    or a final test run (`phase="test"`, `index` = seed)."""

    dataset: str
    attention: str
    phase: str
    index: int

    @property
    def parts(self):
        slug = self.attention.replace("+", "_")
        return self.dataset, slug, self.phase, f"{self.phase}{self.index}"


class Cache:
    """One JSON file per run, `root/<dataset>/<attention>/<phase>/
    <phase><index>.json`; a file present means the run is done."""

    def __init__(self, root):
        self.root = root

    def path(self, key):
        *folders, name = key.parts
        return os.path.join(self.root, *folders, f"{name}.json")

    def get(self, key):
        """The run cached under `key`, or None."""
        path = self.path(key)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def put(self, key, run):
        path = self.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(run, f)
        os.replace(path + ".tmp", path)  # a killed run leaves no half file

    def runs(self, smoke):
        """Every cached run of the given mode."""
        for folder, _, files in sorted(os.walk(self.root)):
            for name in sorted(files):
                if name.endswith(".json"):
                    with open(os.path.join(folder, name)) as f:
                        run = json.load(f)
                    if run["smoke"] == smoke:
                        yield run


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    arg = p.add_argument
    arg("--datasets", default=",".join(DATASETS), help="comma-separated")
    arg("--attentions", default=",".join(ATTENTIONS), help="comma-separated")
    arg("--seeds", type=int, default=5, help="final runs per attention")
    arg("--candidates", type=int, default=3, help="tuning candidates")
    arg("--max-length", type=int, default=128, help="longer series: patches")
    arg("--output", default="benchmarks/results/offline_suite")
    arg("--report", action="store_true", help="only write the report")
    arg("--smoke", action="store_true", help="1 epoch, tiny: checks the code")
    args = p.parse_args(argv)
    args.datasets = args.datasets.split(",")
    args.attentions = args.attentions.split(",")
    unknown = set(args.datasets) - set(DATASETS)
    if unknown:
        p.error(
            f"--datasets: unknown {sorted(unknown)}; choose from {DATASETS}"
        )
    unknown = set(args.attentions) - set(ATTENTIONS)
    if unknown:
        p.error(f"--attentions: unknown {sorted(unknown)}; from {ATTENTIONS}")
    for name in ("seeds", "candidates", "max_length"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def candidates(count):
    """`count` hyperparameter sets drawn from SPACE with a fixed seed."""
    rng = np.random.default_rng(20230501)
    return [
        {k: v[rng.integers(len(v))] for k, v in SPACE.items()}
        for _ in range(count)
    ]


def validation_split(train):
    """A stratified 75/25 split of the `Split` `train` (fixed seed)."""
    from sklearn.model_selection import train_test_split

    classes = len(np.unique(train.y))
    size = max(0.25, classes / len(train.y))
    fit, val = train_test_split(
        np.arange(len(train.y)),
        test_size=size,
        random_state=0,
        stratify=train.y,
    )
    return train.take(fit), train.take(val)


def train_once(
    attention, config, *, train, evaluate, classes, seed, smoke, diversity
):
    """One model: fit on the `Split` `train`, score `evaluate` every epoch.

    With `diversity`, also the head redundancy on 64 `evaluate` series, with
    pooled heads seen both ways (`attention_maps`'s `pooled_view`).
    """
    import keras

    import keras_svr_attention as ksa

    keras.utils.set_random_seed(seed)
    epochs = 1 if smoke else config["epochs"]
    batch_size = 16 if len(train.y) < 100 else 32
    model = ksa.timeseries_classifier(
        train.x.shape[1],
        train.x.shape[2],
        classes,
        attention=attention,
        width=config["width"],
        depth=config["depth"],
        num_heads=NUM_HEADS,
        mlp_dim=2 * config["width"],
        beta=config["beta"],
        dropout=config["dropout"],
        input_noise=config["input_noise"],
    )
    steps = epochs * math.ceil(len(train.y) / batch_size)
    model.compile(
        optimizer=keras.optimizers.AdamW(
            keras.optimizers.schedules.CosineDecay(
                config["learning_rate"], steps
            ),
            weight_decay=0.05,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    history = model.fit(
        [train.x, train.mask],
        train.y,
        batch_size=batch_size,
        epochs=epochs,
        validation_data=([evaluate.x, evaluate.mask], evaluate.y),
        verbose=0,
    )
    seconds = time.perf_counter() - start
    curve = [100 * a for a in history.history["val_accuracy"]]
    result = {
        "accuracy": curve[-1],
        "loss": history.history["val_loss"][-1],
        "best_epoch_accuracy": max(curve),
        "curve": curve,
        "train_seconds": seconds,
    }
    sample = evaluate.take(slice(0, 64))
    for view in ("shared", "window") if diversity else ():
        maps = ksa.attention_maps(
            model, [sample.x, sample.mask], pooled_view=view
        )
        result[f"redundancy_{view}"] = ksa.head_redundancy(maps, sample.mask)
    del model
    keras.backend.clear_session()
    np.testing.assert_(np.isfinite(result["loss"]), "non-finite loss")
    return result


def plan(args, configs):
    """Every run of the suite, in order: per set and attention, the tuning
    candidates, then the test seeds."""
    return [
        RunKey(dataset, attention, phase, index)
        for dataset in args.datasets
        for attention in args.attentions
        for phase, count in (("tune", len(configs)), ("test", args.seeds))
        for index in range(count)
    ]


def run_suite(args):
    """Trains every run that the cache does not hold; returns how many."""
    import keras

    from keras_svr_attention.datasets import load_uea

    cache = Cache(os.path.join(args.output, "runs"))
    configs = candidates(args.candidates)
    keys = plan(args, configs)
    data, done = {}, 0
    started = time.perf_counter()
    for step, key in enumerate(keys, 1):
        if current_run(cache, key, configs, args.smoke) is not None:
            continue
        if key.dataset not in data:
            train, test, names = load_uea(key.dataset, args.max_length)
            data = {key.dataset: (Split(*train), Split(*test), len(names))}
        train, test, classes = data[key.dataset]
        if key.phase == "tune":
            candidate, config = key.index, configs[key.index]
            fit, val = validation_split(train)
            seed, diversity, label = 0, False, f"candidate {key.index}"
        else:
            candidate, config = choose(cache, key, configs)
            fit, val = train, test
            seed, diversity, label = key.index, True, f"seed {key.index}"
        result = train_once(
            key.attention,
            config,
            train=fit,
            evaluate=val,
            classes=classes,
            seed=seed,
            smoke=args.smoke,
            diversity=diversity,
        )
        result.update(
            dataset=key.dataset,
            attention=key.attention,
            candidate=candidate,
            config=config,
            backend=keras.config.backend(),
            smoke=args.smoke,
        )
        cache.put(key, result)
        done += 1
        elapsed = time.perf_counter() - started
        print(
            f"[{step}/{len(keys)}] {key.dataset} {key.attention} "
            f"{key.phase} {label}: {result['accuracy']:.2f}% in "
            f"{result['train_seconds']:.0f} s ({elapsed / 60:.1f} min this "
            "session)",
            flush=True,
        )
    return done


def tuning_runs(cache, key, configs):
    """The cached tuning runs of `key`'s set and attention (None: missing)."""
    return [
        cache.get(key._replace(phase="tune", index=index))
        for index in range(len(configs))
    ]


def best_candidate(tuning):
    """The index of the tuning run with the best validation accuracy (then
    the lower loss, then the lower index)."""
    return min(
        range(len(tuning)),
        key=lambda i: (-tuning[i]["accuracy"], tuning[i]["loss"], i),
    )


def choose(cache, key, configs):
    """(index, config) of the candidate tuning chose for `key`'s set and
    attention."""
    best = best_candidate(tuning_runs(cache, key, configs))
    return best, configs[best]


def current_run(cache, key, configs, smoke):
    """The run cached under `key` if it still counts, else None: same mode
    and, for a test run, trained on the candidate that tuning chooses now
    (more `--candidates` can change the choice; tuning runs are kept)."""
    run = cache.get(key)
    if run is None or run["smoke"] != smoke:
        return None
    if key.phase == "test":
        tuning = tuning_runs(cache, key, configs)
        if None in tuning or run["candidate"] != best_candidate(tuning):
            return None
    return run


def collect(cache, args, configs):
    """{dataset: {attention: [test runs]}} for every current test run."""
    table = {}
    for dataset in args.datasets:
        for attention in args.attentions:
            keys = [
                RunKey(dataset, attention, "test", seed)
                for seed in range(args.seeds)
            ]
            runs = [current_run(cache, k, configs, args.smoke) for k in keys]
            runs = [run for run in runs if run is not None]
            if runs:
                table.setdefault(dataset, {})[attention] = runs
    return table


# The report's sections, from small functions below.


def markdown(header, rows):
    """A Markdown table: a header row, then rows of cells."""
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    rule = "|" + "---|" * len(header)
    return "\n".join([line(header), rule, *map(line, rows)])


def accuracy_table(table, attentions, key):
    """One row per dataset, mean ± std over seeds per attention, and the
    mean over the sets every attention finished."""
    rows, means = [], {a: [] for a in attentions}
    for dataset, runs in table.items():
        cells = []
        for a in attentions:
            values = [r[key] for r in runs.get(a, [])]
            cells.append(
                f"{np.mean(values):.2f} ± {np.std(values):.2f}"
                if values
                else "–"
            )
            if len(runs) == len(attentions):
                means[a].append(np.mean(values))
        rows.append([dataset, *cells])
    complete = len(next(iter(means.values()), []))
    rows.append(
        [f"mean over {complete} sets"]
        + [f"{np.mean(means[a]):.2f}" if complete else "–" for a in attentions]
    )
    return markdown(["dataset", *attentions], rows)


def paired_tests(table, attentions, key):
    """Wilcoxon signed-rank of each variant against softmax.

    Pairs are (dataset, seed): the same seed and data for both attentions.
    Returns the Markdown table and {variant: {pairs, mean, p}}.
    """
    from scipy.stats import wilcoxon

    rows, result = [], {}
    for a in attentions:
        if a == "softmax":
            continue
        ours, base = [], []
        for runs in table.values():
            if a in runs and "softmax" in runs:
                n = min(len(runs[a]), len(runs["softmax"]))
                ours += [r[key] for r in runs[a][:n]]
                base += [r[key] for r in runs["softmax"][:n]]
        diff = np.array(ours) - np.array(base)
        if not len(diff):
            continue
        nonzero = diff[np.abs(diff) > 1e-9]
        p = float(wilcoxon(nonzero).pvalue) if len(nonzero) >= 2 else 1.0
        result[a] = {"pairs": len(diff), "mean": float(diff.mean()), "p": p}
        wins, ties = (diff > 1e-9).sum(), (np.abs(diff) <= 1e-9).sum()
        rows.append(
            [a, str(len(diff)), f"{diff.mean():+.2f}",
             f"{wins} / {ties} / {(diff < -1e-9).sum()}", f"{p:.3f}"]
        )  # fmt: skip
    header = [
        "variant vs softmax",
        "pairs",
        "mean difference (points)",
        "wins / ties / losses",
        "Wilcoxon p (two-sided)",
    ]
    return markdown(header, rows), result


def set_means(table):
    """The table with each set's seeds replaced by their mean accuracy."""
    return {
        dataset: {
            a: [{"accuracy": float(np.mean([r["accuracy"] for r in runs]))}]
            for a, runs in by_attention.items()
        }
        for dataset, by_attention in table.items()
    }


def redundancy_table(table, attentions):
    """Head diversity per set, both views of pooled heads, and the mean
    over the sets every attention finished."""
    rows = []
    for view in ("shared", "window"):
        means = []
        for dataset, runs in table.items():
            values = [
                np.mean([r[f"redundancy_{view}"] for r in runs[a]])
                if a in runs
                else None
                for a in attentions
            ]
            if None not in values:
                means.append(values)
            cells = ["–" if v is None else f"{v:.3f}" for v in values]
            rows.append([dataset, view, *cells])
        if means:
            cells = [f"**{v:.3f}**" for v in np.mean(means, axis=0)]
            rows.append([f"**mean over {len(means)} sets**", view, *cells])
    return markdown(["dataset", "pooled heads seen as", *attentions], rows)


def chosen_table(table, attentions):
    """Which candidate tuning chose, per set and attention."""
    rows = [
        [dataset]
        + [
            str(runs[a][0]["candidate"]) if a in runs else "–"
            for a in attentions
        ]
        for dataset, runs in table.items()
    ]
    return markdown(["dataset", *attentions], rows)


def critical_difference(table, attentions, path):
    """aeon's diagram over the sets every attention finished; the number
    of those sets (None: fewer than two, no diagram)."""
    import matplotlib

    matplotlib.use("Agg")
    from aeon.visualisation import plot_critical_difference

    rows = [
        [np.mean([r["accuracy"] for r in runs[a]]) for a in attentions]
        for runs in table.values()
        if all(a in runs for a in attentions)
    ]
    if len(rows) < 2:
        return None
    fig, ax = plot_critical_difference(np.array(rows), list(attentions))
    ax.set_title(
        f"Average rank by final test accuracy over {len(rows)} sets "
        "(bars: no significant difference)",
        fontsize=9,
    )
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return len(rows)


REPORT = """# Offline suite: softmax vs BN vs SH vs BN+SH

Written by `benchmarks/offline_suite.py --report` from {count} cached
runs ({hours:.2f} h of training, summed over runs). Backend:
{backend}. Candidates (drawn once, seeded):

```json
{configs}
```

## Final model, test accuracy % (honest: chosen on validation)

{honest}

## Paired test, final model

Over every (dataset, seed) pair:

{tests}

Over the sets' means (seeds of one set share its data, so this is the
stricter test):

{set_tests}

![critical difference](critical_difference.png)

## Paper's protocol: best epoch on the test set, % (same runs)

{paper}

{paper_tests}

## Head diversity (`head_redundancy`, mean over seeds; 64 test series)

{diversity}

## Chosen candidate per set and attention

{chosen}
"""


def write_report(args, configs):
    """report.md, summary.json and critical_difference.png in `--output`,
    from the cached runs."""
    cache = Cache(os.path.join(args.output, "runs"))
    table = collect(cache, args, configs)
    attentions = args.attentions
    runs = list(cache.runs(args.smoke))
    tests, summary = paired_tests(table, attentions, "accuracy")
    text = REPORT.format(
        count=len(runs),
        hours=sum(r["train_seconds"] for r in runs) / 3600,
        backend=runs[0]["backend"] if runs else "–",
        configs=json.dumps(configs, indent=1),
        honest=accuracy_table(table, attentions, "accuracy"),
        tests=tests,
        set_tests=paired_tests(set_means(table), attentions, "accuracy")[0],
        paper=accuracy_table(table, attentions, "best_epoch_accuracy"),
        paper_tests=paired_tests(table, attentions, "best_epoch_accuracy")[0],
        diversity=redundancy_table(table, attentions),
        chosen=chosen_table(table, attentions),
    )
    cd = critical_difference(
        table, attentions, os.path.join(args.output, "critical_difference.png")
    )
    with open(os.path.join(args.output, "report.md"), "w") as f:
        f.write(text)
    summary = {
        "configs": configs,
        "paired_tests": summary,
        "critical_difference_sets": cd,
        "means": {
            dataset: {a: runs[0]["accuracy"] for a, runs in by.items()}
            for dataset, by in set_means(table).items()
        },
    }
    with open(os.path.join(args.output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(text)


def main(argv=None):
    args = parse_args(argv)
    if not args.report:
        run_suite(args)
    write_report(args, candidates(args.candidates))


if __name__ == "__main__":
    main()
