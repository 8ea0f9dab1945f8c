"""Decoding cost per token against context length, and the train-step
memory of causal linear attention.

Decoding: one self-attention layer (width 256, 4 heads of 64, batch 1)
takes one new token after a context of L tokens:

- `mha+kv`: KerasHub's `CachedMultiHeadAttention`, a key/value cache of
  L + 1 slots (skipped without keras-hub);
- `softmax+kv`: `SVRAttention` with the same cache;
- `linear+state`, `linear+bn+sh+state`: `SVRAttention(kernel="linear")`
  with its recurrent state (`get_initial_state`), filled by a prefill of L
  tokens.

The step is compiled where the backend compiles (jax.jit,
tf.function(jit_compile=True); torch runs eagerly). Each variant's
contexts are timed together, interleaved in a rotated order each repeat:
the median milliseconds per token are reported, and the ratio to the
shortest context is the median of the per-repeat ratios. (Timing the
variants together would let a 32 MiB key/value cache evict the state from
the CPU's caches.)
"decode bytes" is the size of the cache or state the step carries.

Train-step memory (JAX only): XLA's temporary bytes of the compiled
gradient of one layer, for MultiHeadAttention, linear non-causal and
linear causal (the chunked recurrence) at T = 1024 .. 16384, and the
causal linear train step at T = 4096 for a few `chunk_size`s (time and
memory), which chose the default.

    KERAS_BACKEND=jax python benchmarks/linear_decoding.py
    KERAS_BACKEND=torch python benchmarks/linear_decoding.py \
        --plot docs/linear_decoding.png
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
WIDTH, HEADS, BATCH = 256, 4, 1
KEY_DIM = WIDTH // HEADS
VARIANTS = ["mha+kv", "softmax+kv", "linear+state", "linear+bn+sh+state"]


def make_layer(variant, chunk_size=64):
    if variant == "mha+kv":
        try:
            from keras_hub.layers import CachedMultiHeadAttention
        except ImportError:
            return None
        return CachedMultiHeadAttention(HEADS, KEY_DIM)
    options = {"softmax+kv": {}, "linear+state": {"kernel": "linear"}}.get(
        variant,
        {"kernel": "linear", "beta": 1.0, "head_factors": [1, 1, 2, 4]},
    )
    return ksa.SVRAttention(HEADS, KEY_DIM, chunk_size=chunk_size, **options)


def carried(variant, layer, context, rng):
    """The cache or state after `context` tokens, and the step's kwargs."""
    if variant.endswith("+state"):
        state = layer.get_initial_state(BATCH)
        prompt = rng.normal(size=(BATCH, context, WIDTH)).astype("float32")
        _, state = layer(prompt, prompt, cache=state, use_causal_mask=True)
        return state, {"use_causal_mask": True}
    shape = (BATCH, 2, context + 1, HEADS, KEY_DIM)
    cache = ops.convert_to_tensor(rng.normal(size=shape).astype("float32"))
    # KerasHub's layer takes no causal flag: the index alone places the token.
    kwargs = {"cache_update_index": context}
    if variant == "softmax+kv":
        kwargs["use_causal_mask"] = True
    return cache, kwargs


def compiled_step(layer, token, carry, kwargs):
    """A function running one decoding step, returning a NumPy scalar."""
    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        frozen = [v.value for v in layer.non_trainable_variables]

        @jax.jit
        def step(token, carry):
            (y, carry), _ = layer.stateless_call(
                trainable, frozen, token, token, cache=carry, **kwargs
            )
            return y, carry

        return lambda: jax.block_until_ready(step(token, carry))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def step(token, carry):
            return layer(token, token, cache=carry, **kwargs)

        return lambda: tf.nest.map_structure(
            lambda t: t.numpy(), step(token, carry)
        )
    import torch

    def step():
        with torch.no_grad():
            y, _ = layer(token, token, cache=carry, **kwargs)
            return y.sum().item()

    return step


def nbytes(tree):
    return int(
        sum(
            np.prod(t.shape)
            * np.dtype(keras.backend.standardize_dtype(t.dtype)).itemsize
            for t in keras.tree.flatten(tree)
        )
    )


def decoding(contexts, repeats, variants=VARIANTS):
    """Per variant, one step per context, timed interleaved: the ratio to
    the shortest context is the median of per-repeat ratios."""
    rng = np.random.default_rng(0)
    token = ops.convert_to_tensor(
        rng.normal(size=(BATCH, 1, WIDTH)).astype("float32")
    )
    rows = []
    for variant in variants:
        layer = make_layer(variant)
        if layer is None:
            continue
        layer(token, token)
        steps, sizes = {}, {}
        for context in contexts:
            carry, kwargs = carried(variant, layer, context, rng)
            steps[context] = compiled_step(layer, token, carry, kwargs)
            steps[context]()  # compile and warm up
            sizes[context] = nbytes(carry)
        times = interleaved(steps, repeats)
        for context in contexts:
            ratios = [
                t / s
                for t, s in zip(times[context], times[contexts[0]], strict=True)
            ]
            rows.append(
                {
                    "context": context,
                    "variant": variant,
                    "ms_per_token": 1000 * statistics.median(times[context]),
                    "ratio_to_shortest": statistics.median(ratios),
                    "decode_bytes": sizes[context],
                }
            )
            print(
                f"{BACKEND} {variant:20s} L={context:6d} "
                f"{rows[-1]['ms_per_token']:8.3f} ms/token "
                f"x{rows[-1]['ratio_to_shortest']:.2f} "
                f"{sizes[context] / 2**20:9.2f} MiB",
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
        f"{HEADS} heads of {KEY_DIM}, batch {BATCH}:",
        "",
        "| context | variant | ms / token | x shortest context | decode MiB |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['context']} | {r['variant']} | {r['ms_per_token']:.3f} | "
        f"{r['ratio_to_shortest']:.2f} | {r['decode_bytes'] / 2**20:.2f} |"
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
        name = os.path.join(output, f"linear_decoding_{backend}.json")
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
        ),
    }
    if BACKEND == "jax" and not args.no_memory:
        result["train"], result["chunks"] = memory(
            [int(t) for t in args.lengths.split(",")],
            [int(c) for c in args.chunk_sizes.split(",")],
            max(3, args.repeats // 6),
        )
    os.makedirs(args.output, exist_ok=True)
    stem = os.path.join(args.output, f"linear_decoding_{BACKEND}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(markdown(result))
    if args.plot:
        plot(args.output, args.plot)
    return result


if __name__ == "__main__":
    main()
