"""Trains a tiny classifier with softmax, BN, SH and BN+SH attention.

A short demo on synthetic data: prints the final loss per attention.

    KERAS_BACKEND=jax python examples/demo.py
"""

import argparse

import keras
import numpy as np

import keras_svr_attention as ksa

ATTENTIONS = {
    "softmax": lambda: ksa.SVRAttention(num_heads=4, key_dim=8),
    "bn": lambda: ksa.AttentionBN(num_heads=4, key_dim=8),
    "sh": lambda: ksa.AttentionSH(num_heads=4, key_dim=8),
    "bn+sh": lambda: ksa.AttentionBNSH(num_heads=4, key_dim=8),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 24, 16)).astype("float32")
    y = (x[:, :12].mean(axis=(1, 2)) > x[:, 12:].mean(axis=(1, 2))).astype(
        "int32"
    )
    for name, make in ATTENTIONS.items():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((24, 16))
        h = make()(inputs, inputs)
        h = keras.layers.GlobalAveragePooling1D()(h)
        model = keras.Model(inputs, keras.layers.Dense(2)(h))
        model.compile(
            "adam",
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        hist = model.fit(x, y, epochs=args.epochs, batch_size=32, verbose=0)
        print(
            f"{name:8s} loss {hist.history['loss'][-1]:.4f} "
            f"accuracy {hist.history['accuracy'][-1]:.3f}"
        )


if __name__ == "__main__":
    main()
