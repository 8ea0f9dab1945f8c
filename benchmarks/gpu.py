"""The GPU check: speed, memory and fused kernels, and one example trained.

On the active backend (JAX or torch; TensorFlow has no fused kernel):

1. Speed against `keras.layers.MultiHeadAttention`: forward+backward of one
   layer (width 64, 2 heads, SH factors [1, 2], the LRA shape) at each
   `--lengths`, interleaved repeats, median ratio to MHA (as
   `speed.py`), in `--dtype` (bfloat16 by default: the fused kernels need
   half precision).
2. Peak memory of that step, from torch's allocator
   (`torch.cuda.max_memory_allocated`), or XLA's compiled memory analysis
   on JAX; and whether a fused attention kernel ran: the kernel names that
   torch's profiler records (flash, memory-efficient, cuDNN) or the cuDNN
   custom call in JAX's compiled program.
3. `examples/image_classification.py` trained end to end on the device
   (digits, every attention, one seed).
4. The tables go into `--docs` between the markers
   `<!-- gpu:<backend>:begin -->` and `<!-- gpu:<backend>:end -->`, and
   into `--output` as gpu_<backend>.json.

On a machine with an accelerator (under 8 minutes for both backends):

    bash benchmarks/gpu.sh

The CPU dry run (`nox -s gpu`, in CI) runs every step on tiny sizes and
writes into a copy of the docs, so the command cannot rot:

    KERAS_BACKEND=torch python benchmarks/gpu.py --dry-run --docs /tmp/r.md
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import speed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = keras.config.backend()
VARIANTS = ["mha", "softmax", "bn", "sh", "bn+sh"]
FUSED = re.compile(r"flash|efficient_attention|cudnn.*(attention|fmha)|fmha")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--lengths", default="1024,4096", help="sequence lengths")
    p.add_argument("--batch", type=int, default=8, help="batch size")
    p.add_argument("--repeats", type=int, default=9, help="timed repeats")
    p.add_argument("--dtype", default="bfloat16", help="layer dtype")
    p.add_argument("--epochs", type=int, default=20, help="example epochs")
    p.add_argument("--docs", default=os.path.join(ROOT, "docs", "results.md"))
    p.add_argument("--output", default=os.path.join(ROOT, "benchmarks/results"))
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU: tiny sizes, every step (what CI runs)",
    )
    args = p.parse_args(argv)
    if args.dry_run:
        args.lengths, args.batch, args.repeats, args.epochs = "64", 2, 2, 1
    if BACKEND not in ("jax", "torch"):
        p.error(f"the GPU check runs on jax or torch, not {BACKEND}")
    return args


def device_name():
    if BACKEND == "torch":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
        return "cpu"
    import jax

    device = jax.devices()[0]
    return f"{device.platform}: {device.device_kind}"


def peak_memory_mib(program, step):
    """Peak device memory of one training step, in MiB (None on CPU).

    `program`: the step compiled by `jax_program` on JAX, else None.
    """
    if BACKEND == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    analysis = program.memory_analysis()
    if analysis is None:
        return None
    return analysis.temp_size_in_bytes / 2**20


def jax_program(layer, x):
    """The layer's compiled training step (gradient of a sum), on JAX."""
    import jax

    trainable = [v.value for v in layer.trainable_variables]
    frozen = [v.value for v in layer.non_trainable_variables]

    def loss(trainable, inputs):
        y, _ = layer.stateless_call(trainable, frozen, inputs, inputs)
        return y.astype("float32").sum()

    return jax.jit(jax.grad(loss)).lower(trainable, x).compile()


def fused_kernels(layer, x, program):
    """Names of the fused attention kernels one forward pass ran (torch),
    or that the compiled training step `program` calls (JAX)."""
    if BACKEND == "torch":
        import torch

        with torch.profiler.profile() as profile:
            with torch.no_grad():
                layer(x, x)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        names = {event.name for event in profile.events()}
    else:
        text = program.as_text()
        names = set(re.findall(r'custom_call_target="([^"]+)"', text))
    return sorted(n for n in names if FUSED.search(n.lower()))


def attention_table(args):
    rows = []
    width, heads, factors = 64, 2, [1, 2]
    for length in [int(t) for t in args.lengths.split(",")]:
        x = keras.ops.convert_to_tensor(
            np.random.default_rng(0)
            .normal(size=(args.batch, length, width))
            .astype("float32"),
            dtype=args.dtype,
        )
        layers, steps = {}, {}
        for variant in VARIANTS:
            layer = speed.make_layer(variant, width, heads, factors)
            layer.dtype_policy = keras.DTypePolicy(args.dtype)
            layer(x, x)
            layers[variant] = layer
            steps[variant] = speed.compiled(layer, x, False, True)
            steps[variant]()  # compile and warm up
        times = speed.interleaved(steps, args.repeats)
        for variant in VARIANTS:
            layer = layers[variant]
            program = jax_program(layer, x) if BACKEND == "jax" else None
            rows.append(
                {
                    "T": length,
                    "variant": variant,
                    "median_ms": 1000 * statistics.median(times[variant]),
                    "ratio_to_mha": speed.median_ratio(times, variant),
                    "peak_mib": peak_memory_mib(program, steps[variant]),
                    "fused": fused_kernels(layer, x, program),
                }
            )
            print(f"{BACKEND} {rows[-1]}", flush=True)
    return rows


def train_example(args):
    """The image example on the device; its summary rows."""
    with tempfile.TemporaryDirectory() as folder:
        command = [
            sys.executable,
            os.path.join(ROOT, "examples", "image_classification.py"),
            *("--seeds", "1", "--epochs", str(args.epochs)),
            *("--output", folder),
        ]
        if args.dry_run:
            command.append("--smoke")
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        with open(os.path.join(folder, "results.json")) as f:
            results = json.load(f)
    return results["summary"], seconds


def markdown(args, device, rows, example, example_seconds):
    when = datetime.date.today().isoformat()
    kind = "CPU dry run (tiny sizes)" if args.dry_run else device
    lines = [
        f"**{BACKEND}** on {kind}, {when}, layers in {args.dtype}, batch "
        f"{args.batch} (`benchmarks/gpu.py`):",
        "",
        "| T | variant | fwd+bwd ms | ratio to MHA | peak MiB | fused kernel |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = "–" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        fused = ", ".join(r["fused"]) or "none"
        lines.append(
            f"| {r['T']} | {r['variant']} | {r['median_ms']:.2f} | "
            f"{r['ratio_to_mha']:.2f} | {peak} | {fused} |"
        )
    lines += [
        "",
        f"`examples/image_classification.py`, digits, {args.epochs} "
        f"epoch(s), one seed, {example_seconds:.0f} s in all:",
        "",
        "| attention | test accuracy %, final epoch | train s |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r['attention']} | {r['test_accuracy']:.2f} | "
        f"{r['train_seconds']:.1f} |"
        for r in example
    ]
    return "\n".join(lines)


def write_docs(path, text):
    """Replaces this backend's block between its markers in `path`."""
    begin, end = f"<!-- gpu:{BACKEND}:begin -->", f"<!-- gpu:{BACKEND}:end -->"
    with open(path) as f:
        docs = f.read()
    if begin not in docs or end not in docs:
        raise SystemExit(f"error: {path} has no {begin} ... {end} block")
    head, rest = docs.split(begin)
    _, tail = rest.split(end)
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{text}\n{end}{tail}")


def main(argv=None):
    args = parse_args(argv)
    device = device_name()
    print(f"{BACKEND} on {device}", flush=True)
    rows = attention_table(args)
    example, seconds = train_example(args)
    text = markdown(args, device, rows, example, seconds)
    print(text)
    write_docs(args.docs, text)
    os.makedirs(args.output, exist_ok=True)
    name = "gpu_dry_run" if args.dry_run else "gpu"
    with open(os.path.join(args.output, f"{name}_{BACKEND}.json"), "w") as f:
        json.dump(
            {"device": device, "attention": rows, "example": example},
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
