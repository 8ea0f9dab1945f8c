"""Exact FLOPs and temporary memory of compiled attention models (JAX/XLA).

For each attention variant, builds the paper's LRA configuration (width 64,
2 heads with SH factors [1, 2], FFN 128, 2 layers) and compiles the forward
and the forward+backward programs with XLA; reads FLOPs from
`cost_analysis()` and temporary bytes from `memory_analysis()`, and reports
each as a ratio to softmax next to the paper's (its LRA efficiency figure).

    KERAS_BACKEND=jax python benchmarks/flops.py --output benchmarks/results

Counts, not timings: the same numbers on every run. Memory on CPU depends on
XLA's fusion choices and is indicative only (docs/results.md, FLOPs).
"""

import argparse
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402

VARIANTS = ["softmax", "bn", "sh", "bn+sh", "linear", "linear+bn+sh"]
# Paper, LRA Retrieval, BN+SH vs softmax (its efficiency figure).
PAPER_FLOP_RATIO = {512: 0.84, 4096: 0.75, 8192: 0.76}


def build(variant, length, width, num_heads, factors, ffn, depth):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((length, width))
    x = inputs
    for i in range(depth):
        options = ksa.options_used_by(variant, head_factors=factors)
        layer = ksa.get(variant, num_heads, width // num_heads, **options)
        x = ksa.TransformerEncoderBlock(
            num_heads, ffn, attention=layer, name=f"block_{i}"
        )(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(2)(x))


def measure(model, batch, length, width):
    """FLOPs and temp bytes of the compiled forward and training programs."""
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    x = jax.ShapeDtypeStruct((batch, length, width), "float32")

    def forward(trainable, x):
        y, _ = model.stateless_call(trainable, frozen, x)
        return y

    def loss(trainable, x):
        return forward(trainable, x).sum()

    out = {}
    for name, fn in (("forward", forward), ("train", jax.grad(loss))):
        compiled = jax.jit(fn).lower(trainable, x).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        memory = compiled.memory_analysis()
        out[name] = {
            "flops": float(cost.get("flops", 0.0)),
            "temp_bytes": int(getattr(memory, "temp_size_in_bytes", 0)),
        }
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--output", default="benchmarks/results")
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args(argv)
    lengths = [int(t) for t in args.lengths.split(",")]
    variants = args.variants.split(",")
    configs = {
        "lra": dict(width=64, num_heads=2, factors=[1, 2], ffn=128, depth=2),
        "uea": dict(
            width=64,
            num_heads=8,
            factors=[1, 1, 2, 2, 4, 4, 8, 8],
            ffn=128,
            depth=2,
        ),
    }
    rows = []
    for config, cfg in configs.items():
        for length in lengths:
            base = None
            for variant in variants:
                model = build(variant, length, **cfg)
                m = measure(model, args.batch, length, cfg["width"])
                if variant == "softmax":
                    base = m
                row = {"config": config, "T": length, "variant": variant}
                for prog in ("forward", "train"):
                    for key in ("flops", "temp_bytes"):
                        row[f"{prog}_{key}"] = m[prog][key]
                        row[f"{prog}_{key}_ratio"] = m[prog][key] / max(
                            base[prog][key], 1
                        )
                rows.append(row)
                print(
                    f"{config} T={length:5d} {variant:13s} "
                    f"fwd flops x{row['forward_flops_ratio']:.3f} "
                    f"train flops x{row['train_flops_ratio']:.3f} "
                    f"fwd temp x{row['forward_temp_bytes_ratio']:.3f} "
                    f"train temp x{row['train_temp_bytes_ratio']:.3f}",
                    flush=True,
                )
    write(rows, args.output, lengths)
    return rows


def write(rows, output, lengths):
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "flops.json"), "w") as f:
        json.dump(
            {"jax": jax.__version__, "keras": keras.__version__, "rows": rows},
            f,
            indent=2,
        )
    lines = [
        "| config | T | variant | forward FLOPs | ratio | train FLOPs | "
        "ratio | paper BN+SH ratio | train temp MiB | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        paper = ""
        if r["config"] == "lra" and r["variant"] == "bn+sh":
            ratio = PAPER_FLOP_RATIO.get(r["T"])
            paper = f"~{ratio:.2f}" if ratio else ""
        lines.append(
            f"| {r['config']} | {r['T']} | {r['variant']} | "
            f"{r['forward_flops']:.3g} | {r['forward_flops_ratio']:.3f} | "
            f"{r['train_flops']:.3g} | {r['train_flops_ratio']:.3f} | "
            f"{paper} | "
            f"{r['train_temp_bytes'] / 2**20:.1f} | "
            f"{r['train_temp_bytes_ratio']:.3f} |"
        )
    with open(os.path.join(output, "flops.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, config in zip(axes, ("lra", "uea"), strict=True):
        for variant in sorted({r["variant"] for r in rows}):
            pts = [
                r
                for r in rows
                if r["config"] == config and r["variant"] == variant
            ]
            ax.plot(
                [r["T"] for r in pts],
                [r["train_flops_ratio"] for r in pts],
                marker="o",
                label=variant,
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("training FLOPs / softmax")
        ax.set_title(config.upper())
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(output, "flops.png"), dpi=120)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
