"""Compares softmax, BN, SH and BN+SH attention on a UEA time-series task.

Trains the mvts_transformer-shaped `timeseries_classifier` for each attention
and seed, then prints the paper-style table (test accuracy mean ± std,
parameters, training time, head redundancy) and writes results.{md,json,csv},
training curves, attention maps and a head-redundancy plot to `--output`.

Default, offline: UEA JapaneseVowels from the copy inside aeon
(variable-length: padded, with masks). `--dataset NAME` takes any UEA/UCR
name through aeon, which downloads it on a machine with internet.

    pip install -e ".[examples,jax]"
    KERAS_BACKEND=jax python examples/timeseries_classification.py
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

import keras_svr_attention as ksa  # noqa: E402


def load_uea(name):
    """(x_train, mask_train, y_train), (x_test, ...), classes via aeon.

    Series are (steps, channels), zero-padded to the longest one, with a
    boolean mask of the real steps; channels standardized on the train set.
    """
    from aeon.datasets import load_classification

    try:
        x_train, y_train = load_classification(name, split="train")
        x_test, y_test = load_classification(name, split="test")
    except Exception as e:  # aeon raises several types for a bad name
        raise SystemExit(f"error: cannot load dataset {name!r}: {e}") from e
    classes = sorted(set(y_train) | set(y_test))
    series = [np.asarray(s, "float32").T for s in list(x_train) + list(x_test)]
    length = max(len(s) for s in series)
    channels = series[0].shape[1]
    x = np.zeros((len(series), length, channels), "float32")
    mask = np.zeros((len(series), length), bool)
    for i, s in enumerate(series):
        x[i, : len(s)] = np.nan_to_num(s)
        mask[i, : len(s)] = True
    n = len(x_train)
    valid = x[:n][mask[:n]]
    x = (x - valid.mean(0)) / (valid.std(0) + 1e-6) * mask[..., None]
    y = np.array([classes.index(c) for c in list(y_train) + list(y_test)])
    return (x[:n], mask[:n], y[:n]), (x[n:], mask[n:], y[n:]), classes


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--dataset", default="JapaneseVowels")
    common.add_training_arguments(
        p,
        epochs=100,
        batch_size=32,
        learning_rate=3e-3,
        beta=0.6,
        output="runs/timeseries",
    )
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument(
        "--noise",
        type=float,
        default=0.2,
        help="std of Gaussian input noise in training",
    )
    args = p.parse_args(argv)
    attentions = common.parse_attentions(args.attention)
    factors = common.parse_factors(args.head_factors)
    train, test, classes = load_uea(args.dataset)
    if args.smoke:
        args.epochs, args.seeds = 1, 1
        train = tuple(a[:64] for a in train)
        test = tuple(a[:64] for a in test)
    max_length, channels = train[0].shape[1:]

    def build(name):
        return ksa.timeseries_classifier(
            max_length,
            channels,
            len(classes),
            attention=name,
            width=args.width,
            depth=args.depth,
            num_heads=args.num_heads,
            mlp_dim=4 * args.width,
            head_factors=factors,
            beta=args.beta,
            dropout=args.dropout,
            input_noise=args.noise,
        )

    print(
        f"{args.dataset}: {len(train[2])} train, {len(test[2])} test, "
        f"length <= {max_length}, {channels} channels, "
        f"{len(classes)} classes"
    )
    return common.run_comparison(
        build,
        ([train[0], train[1]], train[2]),
        ([test[0], test[1]], test[2]),
        attentions,
        args.seeds,
        args.epochs,
        args.batch_size,
        args.learning_rate,
        args.output,
        redundancy_inputs=[test[0][:64], test[1][:64]],
        redundancy_mask=test[1][:64],
        verbose=2 if args.smoke else 1,
    )


if __name__ == "__main__":
    main()
