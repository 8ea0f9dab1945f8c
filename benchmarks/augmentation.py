"""What DeiT's augmentation (`examples/image_augmentation.py`) costs an epoch.

Runs `examples/image_classification.py` (digits, `small` ViT, softmax
attention, batch 64, 1437 images, 4 epochs, one seed) on the active
backend without augmentation, and `examples/image_augmentation.py` (the
same with DeiT's recipe through Keras's layers: RandAugment and
RandomErasing in the model, MixUp or CutMix on each batch), and reports
the median seconds per epoch of each and their ratio.
The runs follow each other in one invocation, so they share the machine's
state.

    KERAS_BACKEND=torch python benchmarks/augmentation.py
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUPS = [
    ("none", "image_classification"),
    ("RandAugment + RandomErasing + MixUp/CutMix", "image_augmentation"),
]


def epoch_seconds(example, epochs, folder):
    """Median seconds per epoch of `examples/<example>.py`."""
    output = os.path.join(folder, example)
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", f"{example}.py"),
            "--attention",
            "softmax",
            *("--seeds", "1", "--epochs", str(epochs), "--output", output),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with open(os.path.join(output, "results.json")) as f:
        results = json.load(f)
    return results["runs"][0]["epoch_seconds"], results["backend"]


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--epochs", type=int, default=4, help="epochs per setup")
    p.add_argument("--output", default="benchmarks/results")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, example in SETUPS:
            seconds, backend = epoch_seconds(example, args.epochs, folder)
            rows.append({"augmentation": name, "s": seconds})
            print(f"{backend} {name}: {seconds:.2f} s/epoch", flush=True)
    lines = [
        "| backend | augmentation | s / epoch (median) | ratio to none |",
        "|---|---|---|---|",
    ]
    for row in rows:
        row["ratio"] = row["s"] / rows[0]["s"]
        lines.append(
            f"| {backend} | {row['augmentation']} | {row['s']:.1f} "
            f"| {row['ratio']:.2f} |"
        )
    print("\n".join(lines))
    os.makedirs(args.output, exist_ok=True)
    path = os.path.join(args.output, f"augmentation_{backend}")
    with open(path + ".json", "w") as f:
        json.dump({"backend": backend, "rows": rows}, f, indent=2)
    with open(path + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
