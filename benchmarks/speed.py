"""Wall time of each attention relative to keras.layers.MultiHeadAttention.

Forward and forward+backward of one attention layer (self-attention, the
LRA shape: width 64, 2 heads, SH factors [1, 2]) on the active backend,
compiled where the backend compiles (jax.jit, tf.function with XLA, eager
torch). Repeats are interleaved across variants and the median ratio to
MultiHeadAttention is reported, so machine noise hits every variant alike;
the order rotates every repeat, and a second MultiHeadAttention ("mha-copy")
is timed as a control.

    KERAS_BACKEND=torch python benchmarks/speed.py --output benchmarks/results
"""

import argparse
import json
import os
import statistics
import time

import keras
import numpy as np

import keras_svr_attention as ksa

BACKEND = keras.config.backend()
# "mha-copy" is a second MultiHeadAttention: a control whose ratio shows
# the benchmark's own noise and order effects.
VARIANTS = [
    "mha",
    "mha-copy",
    "softmax",
    "bn",
    "sh",
    "bn+sh",
    "linear",
    "linear+bn+sh",
]


def make_layer(variant, width, num_heads, factors):
    if variant.startswith("mha"):
        return keras.layers.MultiHeadAttention(num_heads, width // num_heads)
    options = ksa.options_used_by(variant, head_factors=factors)
    return ksa.get(variant, num_heads, width // num_heads, **options)


def compiled(layer, x, causal, backward):
    """A function running the layer once (and its gradient) on `x`."""

    def forward(inputs):
        return layer(inputs, inputs, use_causal_mask=causal)

    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        frozen = [v.value for v in layer.non_trainable_variables]

        def pure(trainable, inputs):
            y, _ = layer.stateless_call(
                trainable, frozen, inputs, inputs, use_causal_mask=causal
            )
            return y.sum()

        fn = jax.jit(jax.grad(pure) if backward else lambda t, i: pure(t, i))
        return lambda: jax.block_until_ready(fn(trainable, x))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def step(inputs):
            if not backward:
                return tf.reduce_sum(forward(inputs))
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(forward(inputs))
            return tape.gradient(loss, layer.trainable_variables)

        return lambda: [
            tf.convert_to_tensor(t).numpy() for t in tf.nest.flatten(step(x))
        ]
    import torch

    def step():
        if not backward:
            with torch.no_grad():
                return forward(x).sum().item()
        layer.zero_grad()
        loss = forward(x).sum()
        loss.backward()
        return loss.item()

    return step


def interleaved(steps, repeats):
    """Seconds of each step per repeat: {name: [s, ...]}.

    Interleaved, and in a rotated order each repeat, so that no step always
    runs first (or right after another).
    """
    names = list(steps)
    times = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median_ratio(times, name, base="mha"):
    """Median over repeats of the ratio of `name`'s time to `base`'s."""
    return statistics.median(
        t / b for t, b in zip(times[name], times[base], strict=True)
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lengths", default="512,2048")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--output", default="benchmarks/results")
    args = p.parse_args(argv)
    width, heads, factors = 64, 2, [1, 2]
    rows = []
    for length in [int(t) for t in args.lengths.split(",")]:
        x = keras.ops.convert_to_tensor(
            np.random.default_rng(0)
            .normal(size=(args.batch, length, width))
            .astype("float32")
        )
        for backward in (False, True):
            fns = {}
            for variant in VARIANTS:
                layer = make_layer(variant, width, heads, factors)
                layer(x, x)
                fns[variant] = compiled(layer, x, args.causal, backward)
                fns[variant]()  # compile and warm up
            times = interleaved(fns, args.repeats)
            for variant in VARIANTS:
                rows.append(
                    {
                        "backend": BACKEND,
                        "T": length,
                        "program": "forward+backward"
                        if backward
                        else "forward",
                        "variant": variant,
                        "median_ms": 1000 * statistics.median(times[variant]),
                        "median_ratio_to_mha": median_ratio(times, variant),
                    }
                )
                print(
                    f"{BACKEND} T={length} {rows[-1]['program']:16s} "
                    f"{variant:13s} {rows[-1]['median_ms']:8.2f} ms "
                    f"x{rows[-1]['median_ratio_to_mha']:.3f}",
                    flush=True,
                )
    os.makedirs(args.output, exist_ok=True)
    with open(os.path.join(args.output, f"speed_{BACKEND}.json"), "w") as f:
        json.dump(
            {"keras": keras.__version__, "causal": args.causal, "rows": rows},
            f,
            indent=2,
        )
    lines = [
        "| backend | T | program | variant | median ms | ratio to MHA |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['backend']} | {r['T']} | {r['program']} | "
        f"{r['variant']} | {r['median_ms']:.2f} | "
        f"{r['median_ratio_to_mha']:.3f} |"
        for r in rows
    ]
    with open(os.path.join(args.output, f"speed_{BACKEND}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
