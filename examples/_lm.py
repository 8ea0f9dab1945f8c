"""What the two language-model scripts share: the model, its training step
and the cache of finished runs.

The model is KerasHub's GPT-2 from a small config (`GPT2CausalLM` without
a preprocessor: byte ids in, next-byte logits out), the model users
convert, so `replace_attention` is what gets exercised. Nothing here
imports Keras at module level (`--help` works without a backend).
"""

import json
import math
import os

import numpy as np

MODES = ["softmax", "bn", "sh", "bn+sh", "linear", "linear+bn+sh"]
# The decoding benchmark's name of each mode (benchmarks/decoding.py).
BENCHMARK_NAMES = {"linear+bn+sh": "linear-bn+sh"}


def gpt2(vocabulary_size, layers, width, heads, sequence_length, seed):
    """A fresh GPT-2 causal LM of the given size (weights drawn from seed)."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocabulary_size,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=width,
        intermediate_dim=4 * width,
        max_sequence_length=sequence_length,
        dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def convert(lm, mode):
    """`lm` with its attention in `mode` (the preset defaults: beta 1, head
    factors 2^(h // 2)); softmax returns `lm` itself."""
    import keras_svr_attention as ksa

    return lm if mode == "softmax" else ksa.replace_attention(lm, mode)


def compile_lm(lm, learning_rate, steps, warmup=0.1):
    """AdamW (weight decay 0.1), linear warmup over `warmup` of the steps,
    then cosine decay to a tenth; cross-entropy on the next byte."""
    import keras

    warmup_steps = max(1, int(warmup * steps))
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=max(1, steps - warmup_steps),
        alpha=0.1,
        warmup_target=learning_rate,
        warmup_steps=warmup_steps,
    )
    lm.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy("accuracy")],
    )
    return lm


def features(tokens):
    """GPT2CausalLM's inputs for a batch of token ids (no padding)."""
    return {"token_ids": tokens, "padding_mask": np.ones(tokens.shape, bool)}


def bits_per_byte(lm, windows, batch_size):
    """Mean next-byte cross-entropy on `windows` `(N, T + 1)`, in bits."""
    loss = lm.evaluate(
        features(windows[:, :-1]),
        windows[:, 1:],
        batch_size=batch_size,
        verbose=0,
        return_dict=True,
    )["loss"]
    return loss / math.log(2)


class Runs:
    """Finished runs as one JSON file each under `folder`: a run that is
    there is not run again, so an interrupted study resumes."""

    def __init__(self, folder, config):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "config.json")
        if os.path.exists(path):
            with open(path) as f:
                if json.load(f) != config:
                    raise SystemExit(
                        f"{path} holds runs of another configuration: "
                        "pass another --output, or delete it"
                    )
        with open(path, "w") as f:
            json.dump(config, f, indent=1)

    def path(self, name):
        return os.path.join(self.folder, name)

    def get(self, name):
        path = self.path(f"{name}.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def put(self, name, record):
        with open(self.path(f"{name}.json"), "w") as f:
            json.dump(record, f, indent=1)
        return record


def mean_std(values):
    """`mean ± std` of a list of numbers (std over seeds, ddof 0)."""
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def decoding_costs(backend, context=4096):
    """Each mode's (ms per token, bytes) as a ratio to MHA with its
    key/value cache, from benchmarks/results/decoding_<backend>.json at
    `context`: {mode: (ms ratio, bytes ratio)}, empty without that file."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(
        root, "benchmarks", "results", f"decoding_{backend}.json"
    )
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        rows = json.load(f)["decoding"]
    costs = {}
    for mode in MODES:
        name = BENCHMARK_NAMES.get(mode, mode)
        for row in rows:
            if row["variant"] == name and row["context"] == context:
                costs[mode] = (row["ratio_to_mha"], row["bytes_to_mha"])
    return costs
