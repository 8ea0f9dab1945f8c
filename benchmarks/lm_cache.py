"""What a converted KerasHub causal LM carries while it generates: the
numbers in its cache (`_build_cache`, the cache `generate()` threads
through its sampler) against the original's key/value cache, for a buffer
of `--length` tokens.

Rows:

- GPT-2 (KerasHub's transformer blocks), 4 heads of 64, factors
  1, 2, 4, 8;
- Llama with grouped-query attention, 8 query heads on 2 key/value heads
  of 64, factors 2, 4 (one per key/value head);
- every family whose record decodes from a state
  (`convert/families.py`), as its record's tiny example (head dimension
  4 to 8, where the sums and slot flags weigh most), factors 2, 4 per
  pair of key/value heads.

"pooled" is mean(1 / r): the fraction of the key/value cache that the
pooled slots alone take. Weights are untouched: the sizes do not depend on
them.

    KERAS_BACKEND=jax python benchmarks/lm_cache.py --output benchmarks/results
"""

import argparse
import os

import keras
import keras_hub
import numpy as np
from keras import ops

import keras_svr_attention as ksa
from keras_svr_attention.convert import families


def _numbers(lm, token_ids):
    """How many numbers `lm`'s cache holds for `token_ids`' buffer."""
    args = [token_ids]
    if isinstance(lm, keras_hub.models.Gemma3CausalLM):
        padding = ops.ones_like(token_ids, "bool")
        args += [None, None, padding, None]  # images, their masks
    cache = lm._build_cache(*args)[1]
    return sum(int(np.prod(x.shape)) for x in keras.tree.flatten(cache))


def _models():
    """(name, causal LM, head factors) of each row."""
    gpt2 = keras_hub.models.GPT2Backbone(
        vocabulary_size=40, num_layers=2, num_heads=4, hidden_dim=256,
        intermediate_dim=64, max_sequence_length=4096,
    )  # fmt: skip
    yield "gpt2, 4 heads of 64", gpt2, [1, 2, 4, 8]
    llama = keras_hub.models.LlamaBackbone(
        vocabulary_size=40, num_layers=2, num_query_heads=8,
        num_key_value_heads=2, hidden_dim=512, intermediate_dim=64,
    )  # fmt: skip
    yield "llama, 8 on 2 heads of 64", llama, [2, 4]
    for class_name in families.state_classes():
        family = families.FAMILIES[class_name]
        backbone = getattr(keras_hub.models, family.example["backbone"])
        config = family.example["config"]
        heads = next(
            config[key]
            for key in ("num_key_value_heads", "num_heads",
                        "num_attention_heads")
            if key in config
        )  # fmt: skip
        factors = [2, 4] * (heads // 2)  # per key/value head
        yield f"{family.name}, tiny", backbone(**config), factors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--attention", default="bn+sh")
    parser.add_argument(
        "--output", help="folder for lm_cache_<backend>.md (else stdout)"
    )
    args = parser.parse_args()
    token_ids = ops.ones((1, args.length), "int32")
    lines = [
        f"Cache of a converted causal LM ({args.attention}) against its "
        f"key/value cache, buffer {args.length}, "
        f"{keras.backend.backend()}:",
        "",
        "| model | head factors | KV cache numbers | state numbers | x KV "
        "| pooled |",
        "|---|---|---|---|---|---|",
    ]
    for name, backbone, factors in _models():
        task = type(backbone).__name__.replace("Backbone", "CausalLM")
        lm = getattr(keras_hub.models, task)(
            backbone=backbone, preprocessor=None
        )
        new = ksa.replace_attention(lm, args.attention, head_factors=factors)
        kv, state = _numbers(lm, token_ids), _numbers(new, token_ids)
        pooled = np.mean([1 / f for f in factors])
        lines.append(
            f"| {name} | {', '.join(map(str, factors))} | {kv} | {state} | "
            f"{state / kv:.3f} | {pooled:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    if args.output is None:
        print(text, end="")
        return
    path = os.path.join(args.output, f"lm_cache_{keras.backend.backend()}.md")
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
