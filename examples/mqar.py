"""What does each attention give up in recall? Multi-query associative
recall (MQAR), the probe of Zoology (Arora et al. 2023) and Based (2024).

Each sequence lists key/value pairs, then asks for every key again; the
model must answer with its value (`keras_svr_attention.datasets.mqar`).
Attention solves it at any width; a fixed-size state (linear attention)
needs a width that grows with the number of pairs. Here a 2-layer causal
model is trained from scratch in each mode, for each model width and number
of pairs, and its accuracy on held-out sequences is plotted against width,
one panel per number of pairs, as Zoology does.

The model: token embeddings, a short causal depthwise convolution (kernel
3, as Based's blocks have), then pre-LayerNorm blocks
(`keras_svr_attention.TransformerEncoderBlock`, causal) whose attention is
the mode, no position embedding. The convolution hands each value its key,
the step of the induction circuit that a plain transformer takes thousands
of steps to find (a 2-layer GPT-2, width 64, 4 pairs: accuracy 0.28 after
3000 steps on this CPU, the 1/pairs plateau); what is left to learn is the
recall itself, which is where the attentions differ.

Runs are kept as JSON under --output and the grid resumes where it
stopped; --size gpu scales the budget up.

    KERAS_BACKEND=jax python examples/mqar.py
    KERAS_BACKEND=jax python examples/mqar.py --smoke  # about a minute
"""

import argparse
import sys
import time

import _lm
import _shared
import numpy as np

SIZES = {  # --size: training steps, batch, sequence length (fresh data)
    "cpu": (250, 64, 64),
    "gpu": (4000, 128, 256),
    "smoke": (3, 8, 32),
}
VOCABULARY = 256  # keys in [1, 128), values in [128, 256)


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=_shared.HelpFormatter,
    )
    arg = p.add_argument
    arg("--modes", default=",".join(_lm.MODES), help="attentions to train")
    arg(
        "--widths",
        type=_shared.int_list,
        default=[32, 64, 128],
        help="model widths (4 heads each)",
    )
    arg(
        "--pairs",
        type=_shared.int_list,
        default=[4, 8, 16],
        help="key/value pairs per sequence",
    )
    arg("--seeds", type=_shared.positive_int, default=2, help="runs per cell")
    arg(
        "--size",
        choices=sorted(SIZES),
        default="cpu",
        help="budget (cpu: "
        "250 steps of 64 x 64 tokens; gpu: 4000 of 128 x 256)",
    )
    arg("--layers", type=_shared.positive_int, default=2, help="layers")
    arg(
        "--learning-rate",
        type=_shared.positive_float,
        default=3e-3,
        help="AdamW's peak rate",
    )
    arg("--output", default="runs/mqar", help="runs, table and plot")
    arg(
        "--smoke",
        action="store_true",
        help="a tiny grid, a few steps: checks the pipeline in about a minute",
    )
    args = p.parse_args()
    args.modes = args.modes.split(",")
    unknown = sorted(set(args.modes) - set(_lm.MODES))
    if unknown:
        _shared.fail(f"--modes: {unknown} not in {_lm.MODES}")
    if args.smoke:
        args.size, args.seeds = "smoke", 1
        args.widths, args.pairs = args.widths[:1], args.pairs[:2]
    length = SIZES[args.size][2]
    if max(args.pairs) * 4 > length:
        _shared.fail(
            f"--pairs: at most {length // 4} pairs fit in {length} tokens"
        )
    return args


def model(mode, vocabulary_size, width, layers, seed):
    """The recall model: embeddings, a causal depthwise convolution of
    kernel 3, `layers` causal blocks with 4 heads of attention `mode`, a
    LayerNorm and the logits over the vocabulary."""
    import keras

    import keras_svr_attention as ksa

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocabulary_size, width)(tokens)
    x = keras.layers.Conv1D(width, 3, padding="causal", groups=width)(x)
    for _ in range(layers):
        block = ksa.TransformerEncoderBlock(
            num_heads=4, hidden_dim=4 * width, attention=mode
        )
        x = block(x, use_causal_mask=True)
    x = keras.layers.LayerNormalization()(x)
    logits = keras.layers.Dense(vocabulary_size)(x)
    return keras.Model(tokens, logits, name=f"mqar_{_shared.slug(mode)}")


def train_one(args, mode, width, pairs, seed):
    """Trains one model from scratch; its accuracy on held-out queries."""
    steps, batch, length = SIZES[args.size]
    from keras_svr_attention import datasets

    x, y, w = datasets.mqar(steps * batch, length, pairs, VOCABULARY, seed)
    test_x, test_y, test_w = datasets.mqar(
        1000, length, pairs, VOCABULARY, seed=10_000 + seed
    )
    lm = model(mode, VOCABULARY, width, args.layers, seed)
    lm = _lm.compile_lm(lm, args.learning_rate, steps)
    start = time.perf_counter()
    lm.fit(x, y, sample_weight=w, batch_size=batch, epochs=1, verbose=0)
    seconds = time.perf_counter() - start
    result = lm.evaluate(
        test_x,
        test_y,
        sample_weight=test_w,
        batch_size=256,
        verbose=0,
        return_dict=True,
    )
    return {"accuracy": result["accuracy"], "s": seconds}


def run_grid(args, runs):
    cells = [
        (mode, width, pairs, seed)
        for pairs in args.pairs
        for width in args.widths
        for mode in args.modes
        for seed in range(args.seeds)
    ]
    for i, (mode, width, pairs, seed) in enumerate(cells):
        key = f"{_shared.slug(mode)}_w{width}_p{pairs}_seed{seed}"
        if runs.get(key) is None:
            record = runs.put(key, train_one(args, mode, width, pairs, seed))
            print(
                f"[{i + 1}/{len(cells)}] {mode} width {width} pairs "
                f"{pairs} seed {seed}: accuracy {record['accuracy']:.3f} "
                f"({record['s']:.0f} s)",
                flush=True,
            )


def accuracies(args, runs, mode, width, pairs):
    slug = _shared.slug(mode)
    return [
        runs.get(f"{slug}_w{width}_p{pairs}_seed{s}")["accuracy"]
        for s in range(args.seeds)
    ]


def table(args, runs):
    head = [f"{p} pairs, width {w}" for p in args.pairs for w in args.widths]
    lines = [
        f"| mode | {' | '.join(head)} |",
        "|---" * (len(head) + 1) + "|",
    ]
    for mode in args.modes:
        cells = [
            f"{np.mean(accuracies(args, runs, mode, w, p)):.2f}"
            for p in args.pairs
            for w in args.widths
        ]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    steps, batch, length = SIZES[args.size]
    return (
        f"MQAR accuracy on 1000 held-out sequences of {length} tokens, "
        f"{args.layers} causal blocks with 4 heads after a short "
        f"convolution, trained from scratch ({steps} steps of {batch} "
        f"fresh sequences); mean over {args.seeds} seeds.\n\n"
        + "\n".join(lines)
    )


def plot(args, runs, path):
    """Accuracy against width, one panel per number of pairs (Zoology)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(args.pairs), figsize=(3.2 * len(args.pairs), 3), sharey=True
    )
    for ax, pairs in zip(np.atleast_1d(axes), args.pairs, strict=True):
        for mode in args.modes:
            means = [
                np.mean(accuracies(args, runs, mode, w, pairs))
                for w in args.widths
            ]
            ax.plot(args.widths, means, marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xticks(args.widths, [str(w) for w in args.widths])
        ax.set_title(f"{pairs} key/value pairs")
        ax.set_xlabel("model width")
        ax.set_ylim(0, 1.02)
    np.atleast_1d(axes)[0].set_ylabel("MQAR accuracy")
    np.atleast_1d(axes)[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    args = parse_args()
    _shared.import_keras()
    start = time.perf_counter()
    config = {**vars(args), "output": None}
    runs = _lm.Runs(args.output, config)
    run_grid(args, runs)
    text = table(args, runs)
    with open(runs.path("results.md"), "w") as f:
        f.write(text + "\n")
    plot(args, runs, runs.path("mqar.png"))
    print(text)
    print(
        f"\n{time.perf_counter() - start:.0f} s; results in "
        f"{args.output}/results.md and mqar.png",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
