"""Decoding: time per token, bytes carried and prefill time against
context length, for every mode's decoding state; and the train-step memory
of causal linear attention.

Decoding: one self-attention layer (width 256, 8 heads of 32, batch 1;
head factors 1, 1, 2, 2, 4, 4, 8, 8 where SH is on) takes one new token
after a context of L tokens:

- `mha`: KerasHub's `CachedMultiHeadAttention` with its key/value cache of
  L + 1 slots (the baseline of every ratio);
- `softmax`, `bn`, `sh`, `bn+sh`: `SVRAttention` with its decoding state
  (`get_initial_state(1, max_length=L + 1)`), filled by a prefill of L
  tokens: per head group the keys and values of completed windows;
- `gqa-bn+sh`: `SVRGroupedQueryAttention`, 8 query heads on 4 key/value
  heads of factors 1, 2, 4, 8;
- `linear`, `linear-bn+sh`: `kernel="linear"`, the recurrent state.

The step is compiled where the backend compiles (jax.jit,
tf.function(jit_compile=True)); torch runs eagerly, as KerasHub's
`generate()` does there. At each context the variants' steps are timed
interleaved, in a rotated order each repeat: "x mha" is the median of the
per-repeat ratios to `mha`'s step. "bytes" is the size of the cache or
state the step carries. "prefill ms" is one call over the L-token prompt
(compiled likewise), for contexts up to `--prefill-max`.

Train-step memory (JAX only): XLA's temporary bytes of the compiled
gradient of one layer, for MultiHeadAttention, linear non-causal and
linear causal (the chunked recurrence) at T = 1024 .. 16384, and the
causal linear train step at T = 4096 for a few `chunk_size`s (time and
memory), which chose the default.

    KERAS_BACKEND=jax python benchmarks/decoding.py
    KERAS_BACKEND=torch python benchmarks/decoding.py --plot docs/decoding.png
"""

import argparse
import json
import os
import statistics

import keras
import numpy as np
from keras import ops
from speed import interleaved  # benchmarks/speed.py, beside this script

import keras_svr_attention as ksa

BACKEND = keras.config.backend()
WIDTH, HEADS, BATCH = 256, 8, 1
KEY_DIM = WIDTH // HEADS
FACTORS = [1, 1, 2, 2, 4, 4, 8, 8]
PIECE = 1024  # prompt tokens per call when filling a state
VARIANTS = {
    "mha": None,
    "softmax": {},
    "bn": {"beta": 1.0},
    "sh": {"head_factors": FACTORS},
    "bn+sh": {"beta": 1.0, "head_factors": FACTORS},
    "gqa-bn+sh": {"beta": 1.0, "head_factors": FACTORS[1::2]},
    "linear": {"kernel": "linear"},
    "linear-bn+sh": {"kernel": "linear", "beta": 1.0, "head_factors": FACTORS},
}


def make_layer(variant):
    if variant == "mha":
        try:
            from keras_hub.layers import CachedMultiHeadAttention
        except ImportError:
            return None
        return CachedMultiHeadAttention(HEADS, KEY_DIM)
    options = VARIANTS[variant]
    if variant.startswith("gqa"):
        return ksa.SVRGroupedQueryAttention(
            KEY_DIM, HEADS, HEADS // 2, **options
        )
    return ksa.SVRAttention(HEADS, KEY_DIM, **options)


def _causal(start, length, slots):
    """KerasHub's decoder mask for queries start .. start + length - 1."""
    rows = np.arange(start, start + length)[:, None]
    return ops.convert_to_tensor(np.arange(slots)[None] <= rows)[None]


def prompt_call(variant, layer, context):
    """`(call(prompt, carry) -> carry, the empty carry)`: one call of
    the prompt from the initial cache or state."""
    if variant == "mha":
        empty = ops.zeros((BATCH, 2, context + 1, HEADS, KEY_DIM))

        def call(x, cache):
            mask = _causal(0, x.shape[1], context + 1)
            return layer(
                x, x, cache=cache, cache_update_index=0, attention_mask=mask
            )[1]

        return call, empty
    empty = layer.get_initial_state(BATCH, max_length=context + 1)

    def call(x, state):
        return layer(x, x, cache=state, use_causal_mask=True)[1]

    return call, empty


def carried(variant, layer, context, rng):
    """The cache or state after `context` tokens (filled in pieces), and
    the step's kwargs."""
    call, carry = prompt_call(variant, layer, context)
    if variant == "mha":
        # Its cost does not depend on what the cache holds.
        shape = (BATCH, 2, context + 1, HEADS, KEY_DIM)
        carry = ops.convert_to_tensor(rng.normal(size=shape), "float32")
        return carry, {"cache_update_index": context}
    for start in range(0, context, PIECE):
        length = min(PIECE, context - start)
        x = rng.normal(size=(BATCH, length, WIDTH)).astype("float32")
        _, carry = layer(x, x, cache=carry, use_causal_mask=True)
    return carry, {"use_causal_mask": True}


def compiled(fn):
    """`fn(*args)` compiled where the backend compiles; the returned
    callable blocks until the result is ready."""
    if BACKEND == "jax":
        import jax

        jitted = jax.jit(fn)
        return lambda *args: jax.block_until_ready(jitted(*args))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        traced = tf.function(fn, jit_compile=True)
        return lambda *args: tf.nest.map_structure(
            lambda t: t.numpy(), traced(*args)
        )
    import torch

    def run(*args):  # eager: done when it returns, but on a GPU
        with torch.no_grad():
            out = fn(*args)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return out

    return run


def nbytes(tree):
    return int(
        sum(
            np.prod(t.shape)
            * np.dtype(keras.backend.standardize_dtype(t.dtype)).itemsize
            for t in keras.tree.flatten(tree)
        )
    )


def decoding(contexts, repeats, variants, prefill_max):
    """Per context, every variant's step timed interleaved; the ratio to
    `mha` is the median of the per-repeat ratios."""
    rng = np.random.default_rng(0)
    token = ops.convert_to_tensor(
        rng.normal(size=(BATCH, 1, WIDTH)).astype("float32")
    )
    layers = {}
    for variant in variants:
        layer = make_layer(variant)
        if layer is not None:
            layer(token, token)
            layers[variant] = layer
    rows = []
    for context in contexts:
        steps, sizes, prefill = {}, {}, {}
        for variant, layer in layers.items():
            carry, kwargs = carried(variant, layer, context, rng)
            step = compiled(
                lambda t, c, layer=layer, kw=kwargs: layer(t, t, cache=c, **kw)
            )
            steps[variant] = lambda s=step, c=carry: s(token, c)
            steps[variant]()  # compile and warm up
            sizes[variant] = nbytes(carry)
            if context <= prefill_max:
                call, empty = prompt_call(variant, layer, context)
                prompt = ops.convert_to_tensor(
                    rng.normal(size=(BATCH, context, WIDTH)), "float32"
                )
                run = compiled(call)
                run(prompt, empty)
                once = {0: lambda r=run, p=prompt, e=empty: r(p, e)}
                prefill[variant] = min(interleaved(once, 3)[0])
        times = interleaved(steps, repeats)
        base = "mha" if "mha" in times else next(iter(times))
        for variant in steps:
            ratios = [
                t / b for t, b in zip(times[variant], times[base], strict=True)
            ]
            row = {
                "context": context,
                "variant": variant,
                "ms_per_token": 1000 * statistics.median(times[variant]),
                "ratio_to_mha": statistics.median(ratios),
                "decode_bytes": sizes[variant],
                "bytes_to_mha": sizes[variant] / sizes[base],
                "prefill_ms": 1000 * prefill[variant]
                if variant in prefill
                else None,
            }
            rows.append(row)
            print(
                f"{BACKEND} L={context:6d} {variant:14s} "
                f"{row['ms_per_token']:8.3f} ms/token "
                f"x{row['ratio_to_mha']:.2f} "
                f"{sizes[variant] / 2**20:8.2f} MiB "
                f"(x{row['bytes_to_mha']:.2f})",
                flush=True,
            )
    return rows


def train_temp_bytes(kind, length, causal, chunk_size=64):
    """XLA's temporary bytes of one layer's compiled gradient (JAX)."""
    import jax

    if kind == "mha":
        layer = keras.layers.MultiHeadAttention(HEADS, KEY_DIM)
    else:
        layer = ksa.SVRAttention(
            HEADS, KEY_DIM, kernel="linear", chunk_size=chunk_size
        )
    x = np.zeros((BATCH, length, WIDTH), "float32")
    layer(x[:, :8], x[:, :8])
    trainable = [v.value for v in layer.trainable_variables]

    def loss(trainable, x):
        y, _ = layer.stateless_call(trainable, [], x, x, use_causal_mask=causal)
        return ops.sum(ops.square(y))

    spec = jax.ShapeDtypeStruct(x.shape, "float32")
    fn = jax.jit(jax.grad(loss))
    compiled = fn.lower(trainable, spec).compile()
    return compiled.memory_analysis().temp_size_in_bytes, fn, trainable, x


def memory(lengths, chunk_sizes, repeats):
    rows = []
    for length in lengths:
        for kind, causal in (
            ("mha", True),
            ("linear", False),
            ("linear", True),
        ):
            temp = train_temp_bytes(kind, length, causal)[0]
            rows.append(
                {
                    "T": length,
                    "layer": kind + (" causal" if causal else ""),
                    "temp_MiB": temp / 2**20,
                }
            )
            print(
                f"train T={length:6d} {rows[-1]['layer']:14s} "
                f"{rows[-1]['temp_MiB']:9.1f} MiB",
                flush=True,
            )
    chunks, steps = [], {}
    for size in chunk_sizes:
        temp, fn, trainable, x = train_temp_bytes("linear", 4096, True, size)
        steps[size] = lambda fn=fn, t=trainable, x=x: keras.tree.map_structure(
            lambda a: a.block_until_ready(), fn(t, x)
        )
        steps[size]()
        chunks.append({"chunk_size": size, "temp_MiB": temp / 2**20})
    times = interleaved(steps, repeats)
    for row in chunks:
        row["ms"] = 1000 * statistics.median(times[row["chunk_size"]])
        print(
            f"chunk {row['chunk_size']:4d}: {row['temp_MiB']:8.1f} MiB "
            f"{row['ms']:8.1f} ms",
            flush=True,
        )
    return rows, chunks


def markdown(result):
    lines = [
        f"Decoding one token, {BACKEND}, CPU, width {WIDTH}, "
        f"{HEADS} heads of {KEY_DIM}, batch {BATCH}, head factors "
        f"{', '.join(map(str, FACTORS))} where SH is on:",
        "",
        "| context | variant | ms / token | x mha | MiB carried | x mha "
        "| prefill ms |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['context']} | {r['variant']} | {r['ms_per_token']:.3f} | "
        f"{r['ratio_to_mha']:.2f} | {r['decode_bytes'] / 2**20:.2f} | "
        f"{r['bytes_to_mha']:.2f} | "
        + ("" if r["prefill_ms"] is None else f"{r['prefill_ms']:.1f}")
        + " |"
        for r in result["decoding"]
    ]
    if result.get("train"):
        lines += [
            "",
            "Train-step temporary memory (XLA, JAX):",
            "",
            "| T | layer | MiB |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r['T']} | {r['layer']} | {r['temp_MiB']:.1f} |"
            for r in result["train"]
        ]
        lines += [
            "",
            "Causal linear train step, T = 4096:",
            "",
            "| chunk_size | MiB | ms |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r['chunk_size']} | {r['temp_MiB']:.1f} | {r['ms']:.1f} |"
            for r in result["chunks"]
        ]
    return "\n".join(lines) + "\n"


def plot(output, path):
    """ms per token against context, one panel per backend measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = []
    for backend in ("jax", "torch", "tensorflow"):
        name = os.path.join(output, f"decoding_{backend}.json")
        if os.path.exists(name):
            with open(name) as f:
                results.append(json.load(f))
    fig, axes = plt.subplots(
        1, len(results), figsize=(5 * len(results), 3.6), squeeze=False
    )
    for ax, result in zip(axes[0], results, strict=True):
        for variant in VARIANTS:
            rows = [r for r in result["decoding"] if r["variant"] == variant]
            if rows:
                ax.plot(
                    [r["context"] for r in rows],
                    [r["ms_per_token"] for r in rows],
                    marker="o",
                    label=variant,
                )
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="context length",
            ylabel="ms per generated token",
            title=f"{result['backend']}, CPU",
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--contexts", default="256,1024,4096,16384")
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--chunk-sizes", default="16,32,64,128,256")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--prefill-max", type=int, default=4096)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--output", default="benchmarks/results")
    p.add_argument(
        "--plot",
        default=None,
        help="also draw every backend's results in --output to this PNG",
    )
    args = p.parse_args(argv)
    result = {
        "backend": BACKEND,
        "keras": keras.__version__,
        "decoding": decoding(
            [int(c) for c in args.contexts.split(",")],
            args.repeats,
            args.variants.split(","),
            args.prefill_max,
        ),
    }
    if BACKEND == "jax" and not args.no_memory:
        result["train"], result["chunks"] = memory(
            [int(t) for t in args.lengths.split(",")],
            [int(c) for c in args.chunk_sizes.split(",")],
            max(3, args.repeats // 6),
        )
    os.makedirs(args.output, exist_ok=True)
    stem = os.path.join(args.output, f"decoding_{BACKEND}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))
    if args.plot:
        plot(args.output, args.plot)
    return result


if __name__ == "__main__":
    main()
