"""Writes the converted KerasHub models that the cross-backend test loads.

Run once per backend, from the repository root:

    KERAS_BACKEND=jax python tests/scripts/save_converted_models.py

For each tiny model of `tests/convert/test_kerashub.py::CONVERTED` (BERT, ViT,
GPT-2 converted to Attention-BN+SH) it writes `<name>-<backend>.keras` and
`<name>-<backend>.npz` (the inputs and the outputs this backend computed)
into `tests/data/converted/`.
"""

import os
import sys

import keras
import numpy as np

sys.path.insert(0, os.getcwd())

import keras_svr_attention as ksa  # noqa: E402
from tests.convert import test_kerashub as hub  # noqa: E402
from tests.testing import random_weights  # noqa: E402


def main():
    backend = keras.config.backend()
    os.makedirs(hub.SAVED, exist_ok=True)
    for name, make in hub.CONVERTED.items():
        model, inputs, key, factors, prefix = make()
        random_weights(model, seed=6)
        new = ksa.replace_attention(
            model, "bn+sh", head_factors=factors, num_prefix_tokens=prefix
        )
        path = os.path.join(hub.SAVED, f"{name}-{backend}")
        new.save(path + ".keras")
        arrays = (
            {f"in_{k}": v for k, v in inputs.items()}
            if isinstance(inputs, dict)
            else {"in_": inputs}
        )
        output = keras.ops.convert_to_numpy(hub._output(new, inputs, key))
        np.savez(path + ".npz", output=output, **arrays)
        print(path, output.shape)


if __name__ == "__main__":
    main()
