"""Converts a trained softmax model to Attention-BN, -SH and -BN+SH.

Loads a trained `.keras` model (by default the softmax time-series
classifier that `timeseries_classification.py` saves), replaces every
MultiHeadAttention with `keras_svr_attention.replace_attention`, keeping the
weights, and reports test accuracy right after conversion and after a short
fine-tune, as a table (results.md / results.json) and a plot.

    KERAS_BACKEND=jax python examples/timeseries_classification.py
    KERAS_BACKEND=jax python examples/convert_pretrained.py

Offline: the data is UEA JapaneseVowels from the copy inside aeon.

`--preset NAME` converts a KerasHub text-classifier preset instead (for
example bert_tiny_en_uncased_sst2; needs `pip install --no-deps keras-hub
kagglehub` and a network to download it) and reports how often the
converted model predicts what the original predicts on a few built-in
sentences.
"""

import argparse
import json
import os

import _shared

DEFAULT_MODEL = "runs/ts/softmax_seed0.keras"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=_shared.HelpFormatter,
    )
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="a trained .keras classifier of the time-series example",
    )
    p.add_argument(
        "--preset",
        default=None,
        help="a KerasHub TextClassifier preset to convert instead of --model",
    )
    p.add_argument(
        "--dataset",
        default="JapaneseVowels",
        help="the UEA set the model was trained on (aeon name)",
    )
    p.add_argument(
        "--attention",
        default="bn,sh,bn+sh",
        help="comma-separated names to convert to (see ksa.get)",
    )
    p.add_argument("--beta", type=float, default=0.6, help="BN's beta")
    p.add_argument(
        "--head-factors",
        type=_shared.int_list,
        default=None,
        help="comma-separated pooling factors, one per head "
        "(default 2^(h // 2))",
    )
    p.add_argument(
        "--epochs",
        type=_shared.positive_int,
        default=5,
        help="fine-tuning epochs",
    )
    p.add_argument(
        "--learning-rate",
        type=_shared.positive_float,
        default=3e-4,
        help="fine-tuning rate",
    )
    p.add_argument(
        "--batch-size", type=_shared.positive_int, default=32, help="batch"
    )
    p.add_argument(
        "--output", default="runs/convert", help="folder for the results"
    )
    p.add_argument(
        "--smoke", action="store_true", help="1 epoch on a few samples"
    )
    args = p.parse_args(argv)
    if args.preset is None and not os.path.exists(args.model):
        p.error(
            f"--model {args.model} does not exist: train it first with "
            "examples/timeseries_classification.py (it saves "
            f"{DEFAULT_MODEL}), or give a .keras file"
        )
    return args


def main(argv=None):
    args = parse_args(argv)  # before Keras: --help needs no backend
    keras = _shared.import_keras()
    import numpy as np

    import keras_svr_attention as ksa

    if args.preset is not None:
        return convert_preset(args)
    try:
        train, test, _ = ksa.datasets.load_uea(args.dataset)
    except ValueError as e:
        _shared.fail(str(e))
    if args.smoke:  # 64 random series of each split
        pick = np.random.default_rng(0).permutation
        train = tuple(a[pick(len(train[2]))[:64]] for a in train)
        test = tuple(a[pick(len(test[2]))[:64]] for a in test)
        args.epochs = 1
    original = keras.saving.load_model(args.model)
    length = original.inputs[0].shape[1]
    if train[0].shape[1] != length:
        # The saved model fixes the padded length; pad or cut to it.
        def fit(x):
            width = [(0, 0), (0, max(length - x.shape[1], 0))]
            width += [(0, 0)] * (x.ndim - 2)
            return np.pad(x, width)[:, :length]

        train = (fit(train[0]), fit(train[1]), train[2])
        test = (fit(test[0]), fit(test[1]), test[2])

    def accuracy(model):
        logits = model.predict([test[0], test[1]], verbose=0)
        return 100 * float(np.mean(logits.argmax(-1) == test[2]))

    rows = [
        {"attention": "softmax (original)", "converted": accuracy(original)}
    ]
    rows[0]["fine_tuned"] = rows[0]["converted"]
    for name, model in convert(original, args).items():
        row = {"attention": name, "converted": accuracy(model)}
        model.compile(
            optimizer=keras.optimizers.AdamW(args.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(
            [train[0], train[1]],
            train[2],
            batch_size=args.batch_size,
            epochs=args.epochs,
            **_shared.progress(args.epochs)[0],
        )
        row["fine_tuned"] = accuracy(model)
        rows.append(row)
        print(
            f"{name}: {row['converted']:.2f} % right after conversion, "
            f"{row['fine_tuned']:.2f} % after {args.epochs} epochs"
        )
    write(rows, args)


def convert(original, args):
    """Every `--attention` conversion, all checked before any training."""
    import keras_svr_attention as ksa

    models = {}
    for name in args.attention.split(","):
        try:
            options = ksa.options_used_by(
                name, beta=args.beta, head_factors=args.head_factors
            )
            models[name] = ksa.replace_attention(original, name, **options)
        except ValueError as e:
            _shared.fail(f"--attention {name}: {str(e).splitlines()[0]}")
    return models


SENTENCES = [
    "a gripping, beautifully acted film",
    "the plot drags and the jokes fall flat",
    "one of the best movies of the year",
    "i want those two hours of my life back",
    "warm, funny and surprisingly moving",
    "a dull, lifeless remake",
    "the cast is wonderful and the score soars",
    "confusing, loud and far too long",
]


def convert_preset(args):
    """A KerasHub classifier preset: agreement with the original's
    predictions right after conversion (no labelled data to fine-tune on)."""
    import keras
    import numpy as np

    try:
        import keras_hub
    except ImportError:
        _shared.fail(
            "--preset needs keras-hub: pip install --no-deps keras-hub"
        )
    try:
        original = keras_hub.models.TextClassifier.from_preset(args.preset)
    except Exception as e:  # no network, unknown name, missing extra
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        _shared.fail(
            f"cannot load KerasHub preset {args.preset!r} (it is "
            f"downloaded; offline?): {message}"
        )
    want = keras.ops.convert_to_numpy(original.predict(SENTENCES, verbose=0))
    rows = [{"attention": "softmax (original)", "converted": 100.0}]
    rows[0]["fine_tuned"] = float("nan")
    for name, model in convert(original, args).items():
        got = keras.ops.convert_to_numpy(model.predict(SENTENCES, verbose=0))
        agree = 100 * float(np.mean(got.argmax(-1) == want.argmax(-1)))
        rows.append(
            {"attention": name, "converted": agree, "fine_tuned": float("nan")}
        )
        print(f"{name}: predicts what the original does on {agree:.0f} %")
    args.epochs = 0
    args.dataset = f"{args.preset}, agreement with the original %"
    write(rows, args)


def write(rows, args):
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.output, exist_ok=True)
    lines = [
        "| attention | test accuracy %, converted | "
        f"after {args.epochs} fine-tuning epochs |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r['attention']} | {r['converted']:.2f} | {r['fine_tuned']:.2f} |"
        for r in rows
    ]
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.output, "results.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.output, "results.json"), "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [r["attention"] for r in rows]
    positions = np.arange(len(rows))
    ax.bar(
        positions - 0.2,
        [r["converted"] for r in rows],
        0.4,
        label="right after conversion",
    )
    ax.bar(
        positions + 0.2,
        [r["fine_tuned"] for r in rows],
        0.4,
        label=f"after {args.epochs} fine-tuning epochs",
    )
    ax.set_xticks(positions, names)
    ax.set_ylabel("test accuracy %")
    ax.set_title(f"Converting a trained softmax model ({args.dataset})")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(os.path.join(args.output, "conversion.png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
