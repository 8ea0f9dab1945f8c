"""How much training brings a converted language model's quality back?

A byte-level GPT-2 (KerasHub, small config) is pretrained with softmax
attention for N steps on English text. From that one checkpoint:

- control: softmax training continues for k * N more steps;
- conversion: `replace_attention` turns it into BN, SH, BN+SH, linear and
  linear BN+SH, weights kept, and each is uptrained for the same k * N
  steps (k = 0: converted, not trained);
- from scratch: each mode trained for N + k_max * N steps from the
  initialization, which tells "the mode is worse" from "converting costs".

Each uptraining budget is its own run (warmup, then cosine decay over its
steps); the seed orders the uptraining data. Held-out bits per byte are on
the test split, which chooses nothing (the configuration is fixed up
front). The text defaults to the standard library's docstrings, split by
module (`keras_svr_attention.datasets.load_text`): no download.

Runs are kept as JSON under --output (the pretrained weights as
`pretrained.weights.h5`) and an interrupted study resumes where it stopped.
The table goes to results.md beside each mode's decoding cost, read from
the decoding benchmark's results (benchmarks/decoding.py).

    KERAS_BACKEND=jax python examples/lm_uptraining.py
    KERAS_BACKEND=jax python examples/lm_uptraining.py --smoke  # a minute
"""

import argparse
import os
import sys
import time

import _lm
import _shared
import numpy as np

CONFIGS = {  # --size: layers, width, heads, sequence length, batch
    "cpu": (4, 128, 4, 128, 16),
    "gpu": (8, 512, 8, 512, 32),
    "smoke": (2, 32, 4, 32, 4),
}


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=_shared.HelpFormatter,
    )
    arg = p.add_argument
    arg(
        "--text",
        default="stdlib",
        help="'stdlib', a text file, "
        "'tiny-shakespeare' or 'enwik8' (downloaded)",
    )
    arg("--modes", default=",".join(_lm.MODES), help="conversion targets")
    arg(
        "--size",
        choices=sorted(CONFIGS),
        default="cpu",
        help="model size "
        "(cpu: 4 layers, width 128, 128 bytes; gpu: 8, 512, 512)",
    )
    arg(
        "--pretrain-steps",
        type=_shared.positive_int,
        default=1000,
        help="N, softmax pretraining steps",
    )
    arg(
        "--fractions",
        default="0.05,0.2",
        help="k, uptraining steps as a "
        "fraction of N (k = 0 is always reported)",
    )
    arg("--seeds", type=_shared.positive_int, default=3, help="data orders")
    arg(
        "--scratch-seeds",
        type=int,
        default=1,
        help="from-scratch runs per mode (0: none)",
    )
    arg(
        "--learning-rate",
        type=_shared.positive_float,
        default=3e-3,
        help="peak rate of pretraining and from scratch",
    )
    arg(
        "--uptrain-learning-rate",
        type=_shared.positive_float,
        default=5e-4,
        help="peak rate of uptraining and the control",
    )
    arg("--output", default="runs/lm_uptraining", help="runs and results")
    arg(
        "--smoke",
        action="store_true",
        help="a tiny model, a few steps, "
        "one seed: checks the pipeline in about a minute",
    )
    args = p.parse_args()
    try:
        args.fractions = [float(k) for k in args.fractions.split(",")]
    except ValueError:
        _shared.fail(
            f"--fractions: comma-separated numbers, got {args.fractions!r}"
        )
    if any(k <= 0 for k in args.fractions):
        _shared.fail("--fractions: each k must be > 0 (k = 0 is implied)")
    args.modes = args.modes.split(",")
    unknown = sorted(set(args.modes) - set(_lm.MODES))
    if unknown:
        _shared.fail(f"--modes: {unknown} not in {_lm.MODES}")
    if args.smoke:
        args.size, args.pretrain_steps = "smoke", 8
        args.fractions = args.fractions[-1:]
        args.seeds, args.scratch_seeds = 1, min(args.scratch_seeds, 1)
    return args


class Study:
    """The text, the fixed test windows and the runs of one configuration."""

    def __init__(self, args):
        from keras_svr_attention import datasets

        self.args = args
        layers, width, heads, length, batch = CONFIGS[args.size]
        self.shape = dict(
            layers=layers, width=width, heads=heads, sequence_length=length
        )
        self.batch = batch
        text = datasets.load_text(args.text)
        self.train = np.frombuffer(text["train"], np.uint8)
        evaluate = np.frombuffer(text["test"], np.uint8)
        count = len(evaluate) // (length + 1)
        if args.smoke:
            count = min(count, 16)
        self.test = evaluate[: count * (length + 1)]
        self.test = self.test.reshape(count, length + 1).astype("int32")
        config = {**vars(args), "output": None, "smoke": args.smoke}
        self.runs = _lm.Runs(args.output, config)

    def batches(self, steps, seed):
        """`steps` batches of random training windows, `(steps * B, T + 1)`."""
        rng = np.random.default_rng(seed)
        length = self.shape["sequence_length"] + 1
        starts = rng.integers(0, len(self.train) - length, steps * self.batch)
        return self.train[starts[:, None] + np.arange(length)].astype("int32")

    def fit(self, lm, steps, learning_rate, seed):
        _lm.compile_lm(lm, learning_rate, steps)
        windows = self.batches(steps, seed)
        start = time.perf_counter()
        lm.fit(
            _lm.features(windows[:, :-1]),
            windows[:, 1:],
            batch_size=self.batch,
            epochs=1,
            shuffle=False,
            verbose=0,
        )
        return time.perf_counter() - start

    def evaluate(self, lm):
        return _lm.bits_per_byte(lm, self.test, 4 * self.batch)

    def fresh(self, seed=0):
        return _lm.gpt2(256, seed=seed, **self.shape)

    def pretrained(self):
        """The softmax model after N steps (trained once, then read)."""
        path = self.runs.path("pretrained.weights.h5")
        record = self.runs.get("pretrained")
        lm = self.fresh()
        if record is None or not os.path.exists(path):
            seconds = self.fit(
                lm, self.args.pretrain_steps, self.args.learning_rate, 0
            )
            lm.save_weights(path)
            record = self.runs.put(
                "pretrained", {"test_bpb": self.evaluate(lm), "s": seconds}
            )
            print(
                f"pretrained: {record['test_bpb']:.3f} bits per byte "
                f"({seconds:.0f} s)",
                flush=True,
            )
        lm.load_weights(path)
        return lm, record


def steps_of(args, k):
    return max(1, round(k * args.pretrain_steps))


def run_study(study):
    """Every run the table needs, skipping those already on disk."""
    args, runs = study.args, study.runs
    base, pretrained = study.pretrained()
    for mode in args.modes:
        name = f"convert_{_shared.slug(mode)}"
        if runs.get(name) is None:
            lm = _lm.convert(base, mode)
            runs.put(name, {"test_bpb": study.evaluate(lm)})
        for k in args.fractions:
            for seed in range(args.seeds):
                key = f"uptrain_{_shared.slug(mode)}_k{k}_seed{seed}"
                if runs.get(key) is not None:
                    continue
                lm = _lm.convert(study.pretrained()[0], mode)
                s = study.fit(
                    lm, steps_of(args, k), args.uptrain_learning_rate, seed + 1
                )
                record = runs.put(key, {"test_bpb": study.evaluate(lm), "s": s})
                print(
                    f"{mode} k={k} seed {seed}: {record['test_bpb']:.3f} "
                    f"bits per byte ({s:.0f} s)",
                    flush=True,
                )
        for seed in range(args.scratch_seeds):
            key = f"scratch_{_shared.slug(mode)}_seed{seed}"
            if runs.get(key) is not None:
                continue
            lm = _lm.convert(study.fresh(seed), mode)
            steps = args.pretrain_steps + steps_of(args, max(args.fractions))
            s = study.fit(lm, steps, args.learning_rate, 0)
            record = runs.put(key, {"test_bpb": study.evaluate(lm), "s": s})
            print(
                f"{mode} from scratch seed {seed}: {record['test_bpb']:.3f}"
                f" bits per byte ({s:.0f} s)",
                flush=True,
            )
    return pretrained


def table(study, pretrained):
    """The markdown table: test bits per byte, mean ± std over seeds, and
    the gap to the softmax control at the same k."""
    args, runs = study.args, study.runs

    def cell(mode, k):
        if k == 0:
            return [runs.get(f"convert_{_shared.slug(mode)}")["test_bpb"]]
        return [
            runs.get(f"uptrain_{_shared.slug(mode)}_k{k}_seed{s}")["test_bpb"]
            for s in range(args.seeds)
        ]

    ks = [0.0, *args.fractions]
    control = {k: np.mean(cell("softmax", k)) for k in ks}
    costs = _lm.decoding_costs(os.environ.get("KERAS_BACKEND", "jax"))
    steps = args.pretrain_steps + steps_of(args, max(args.fractions))
    head = [f"k = {k:g}" for k in ks]
    lines = [
        f"| mode | {' | '.join(head)} | from scratch, {steps} steps | "
        "ms / token, x MHA | cache bytes, x MHA |",
        "|---" * (len(ks) + 4) + "|",
    ]
    for mode in args.modes:
        cells = []
        for k in ks:
            values = cell(mode, k)
            text = f"{values[0]:.3f}"
            if len(values) > 1:
                text = _lm.mean_std(values)
            if mode != "softmax":
                text += f" ({np.mean(values) - control[k]:+.3f})"
            cells.append(text)
        scratch = [
            runs.get(f"scratch_{_shared.slug(mode)}_seed{s}")["test_bpb"]
            for s in range(args.scratch_seeds)
        ]
        cells.append(_lm.mean_std(scratch) if scratch else "")
        ms, size = costs.get(mode, (None, None))
        cells += [f"{ms:.2f}" if ms else "", f"{size:.2f}" if size else ""]
        label = "softmax (control)" if mode == "softmax" else mode
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return (
        f"Test bits per byte after pretraining softmax for "
        f"{args.pretrain_steps} steps: {pretrained['test_bpb']:.3f}. Mean ± "
        f"std over {args.seeds} uptraining data orders; in brackets, the gap "
        "to continued softmax training at the same k.\n\n" + "\n".join(lines)
    )


def main():
    args = parse_args()
    _shared.import_keras()
    start = time.perf_counter()
    study = Study(args)
    pretrained = run_study(study)
    text = table(study, pretrained)
    with open(os.path.join(args.output, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    print(
        f"\n{time.perf_counter() - start:.0f} s; results in "
        f"{args.output}/results.md",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
