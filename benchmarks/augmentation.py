"""What the image example's `--augment keras` costs a training epoch.

One epoch of the digits `small` ViT (softmax attention, batch 64, 1437
images) on the active backend, three ways, each after a warm-up epoch:
no augmentation; RandAugment and RandomErasing inside the model; and the
same plus MixUp/CutMix on each batch (`MixedBatches`). Reports seconds per
epoch and the ratio to no augmentation; the ratios come from one run, so
machine noise hits every row alike.

    KERAS_BACKEND=torch python benchmarks/augmentation.py
"""

import argparse
import json
import os
import sys
import time

import keras
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import image_classification as example  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402


def epoch_seconds(x, y, augment, mix, batch_size):
    model = example.with_augmentation(
        ksa.vit_classifier(x.shape[1:], y.shape[1], preset="small"),
        example.image_augmentation(augment, x.shape[1:]),
    )
    model.compile(
        "adamw", keras.losses.CategoricalCrossentropy(from_logits=True)
    )
    if mix:
        mixers = example.batch_mixers("keras")
        data = {"x": example.MixedBatches(x, y, batch_size, mixers, seed=0)}
    else:
        data = {"x": x, "y": y, "batch_size": batch_size}
    model.fit(**data, epochs=1, verbose=0)  # compile and warm up
    start = time.perf_counter()
    model.fit(**data, epochs=1, verbose=0)
    return time.perf_counter() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--output", default="benchmarks/results")
    args = p.parse_args(argv)
    keras.utils.set_random_seed(0)
    (x, y), _, classes = example.load_dataset("digits")
    y = np.eye(classes, dtype="float32")[y]
    setups = [
        ("none", "none", False),
        ("RandAugment + RandomErasing", "keras", False),
        ("... + MixUp/CutMix batches", "keras", True),
    ]
    backend = keras.config.backend()
    rows = []
    for name, augment, mix in setups:
        seconds = epoch_seconds(x, y, augment, mix, args.batch_size)
        rows.append({"backend": backend, "augmentation": name, "s": seconds})
        print(f"{backend} {name:30s} {seconds:7.2f} s/epoch", flush=True)
    lines = [
        "| backend | augmentation | s / epoch | ratio to none |",
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
        json.dump({"keras": keras.__version__, "rows": rows}, f, indent=2)
    with open(path + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
