"""Data for the examples, offline by default.

- UEA/UCR time-series classification sets as padded, masked arrays
  (`load_uea`; aeon is an optional dependency, `pip install -e
  ".[examples]"`, imported inside the functions);
- English text as bytes for a byte-level language model (`load_text`):
  the standard library's docstrings by default, a file or a standard corpus
  on request;
- multi-query associative recall (`mqar`), the recall probe of Zoology
  (Arora et al. 2023).
"""

import ast
import functools
import math
import os
import sysconfig
import zlib

import keras
import numpy as np


def shipped_classification_sets():
    """Names of the classification sets inside aeon's package (offline)."""
    from aeon import datasets

    folder = os.path.join(os.path.dirname(datasets.__file__), "data")
    names = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name, f"{name}_TRAIN.ts")
        if os.path.exists(path):
            with open(path) as f:
                header = f.read(4096).lower()
            if "@classlabel true" in header:
                names.append(name)
    return names


def load_uea(name, max_length=None):
    """Loads a UEA/UCR classification set through aeon, ready for a model.

    Series become `(steps, channels)` arrays zero-padded to the longest one
    (`keras.utils.pad_sequences`) with a boolean mask of the real steps.
    With `max_length`, series longer than that are averaged over
    non-overlapping patches of ceil(length / max_length) steps (each patch
    over its real steps). Channels are then standardized with the mean and
    standard deviation of the real training steps.

    Sets inside aeon's package (`shipped_classification_sets()`, for
    example JapaneseVowels) load offline; any other UEA/UCR name is
    downloaded by aeon.

    Args:
        name: str. The set's UEA/UCR name.
        max_length: int or None. Longest sequence to return.

    Returns:
        `(x_train, mask_train, y_train), (x_test, mask_test, y_test),
        class_names`, with `x` float32 `(N, T, C)`, `mask` bool `(N, T)`
        and `y` int class indices into `class_names`.

    Raises:
        ValueError: the set is not inside aeon and cannot be downloaded
            (no network, or no such name).

    Example:
    ```python
    (x, mask, y), test, classes = load_uea("JapaneseVowels")
    ```
    """
    from aeon.datasets import load_classification

    try:
        x_train, y_train = load_classification(name, split="train")
        x_test, y_test = load_classification(name, split="test")
    except Exception as e:  # aeon raises several types for these
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"cannot load the UEA/UCR set {name!r}: it is not one of the "
            f"sets inside aeon ({', '.join(shipped_classification_sets())}) "
            f"and downloading it failed ({reason[:120]})"
        ) from None
    series = [np.asarray(s, "float32").T for s in [*x_train, *x_test]]
    lengths = np.array([len(s) for s in series])
    x = keras.utils.pad_sequences(series, dtype="float32", padding="post")
    mask = np.arange(x.shape[1])[None] < lengths[:, None]
    if max_length is not None and x.shape[1] > max_length:
        x, mask = _patch_mean(x, mask, math.ceil(x.shape[1] / max_length))
    n = len(x_train)
    x = np.nan_to_num(x)
    real = x[:n][mask[:n]]
    x = (x - real.mean(0)) / (real.std(0) + 1e-6) * mask[..., None]
    classes = sorted({str(c) for c in [*y_train, *y_test]})
    y = np.array([classes.index(str(c)) for c in [*y_train, *y_test]])
    arrays = (x.astype("float32"), mask, y)
    return (
        tuple(a[:n] for a in arrays),
        tuple(a[n:] for a in arrays),
        classes,
    )


def _patch_mean(x, mask, patch):
    """Means over non-overlapping patches of `patch` steps' real steps."""
    pad = (-x.shape[1]) % patch
    x = np.pad(x, ((0, 0), (0, pad), (0, 0)))
    mask = np.pad(mask, ((0, 0), (0, pad)))
    w = mask.reshape(len(x), -1, patch, 1)
    total = (x.reshape(len(x), -1, patch, x.shape[-1]) * w).sum(2)
    count = w.sum(2)
    return total / np.maximum(count, 1), count[..., 0] > 0


# Standard corpora for `load_text`, downloaded (once, into Keras's cache)
# only when named: the default needs no network.
_CORPORA = {
    "tiny-shakespeare": "https://raw.githubusercontent.com/karpathy/"
    "char-rnn/master/data/tinyshakespeare/input.txt",
    "enwik8": "http://mattmahoney.net/dc/enwik8.zip",
}
_SPLITS = ("train", "validation", "test")
# Folders of the standard library that hold no module docstrings of their
# own (tests, IDLE's tests, installed packages).
_NOT_STDLIB = {"site-packages", "dist-packages", "test", "tests", "idle_test"}


def load_text(source="stdlib"):
    """English text as bytes, split into train, validation and test.

    `"stdlib"` (the default, offline): every docstring of the standard
    library of the running Python, read with `ast` without importing a
    module (about 1.7 MB). Splits are by module, never by bytes: a module
    goes to test when `crc32(its path) % 20 == 0`, to validation when it is
    1, to train otherwise (about 90/5/5), so one module's docstrings never
    straddle two splits and the split does not depend on the machine.

    A path to a text file, `"tiny-shakespeare"` or `"enwik8"` (downloaded
    once through `keras.utils.get_file`): the bytes are cut in order, the
    first 90% for train, the next 5% validation, the last 5% test.

    Args:
        source: str. `"stdlib"`, a file path, or "tiny-shakespeare" or "enwik8".

    Returns:
        A dict `{"train": bytes, "validation": bytes, "test": bytes}`.

    Raises:
        ValueError: `source` is neither a file nor a known name.

    Example:
    ```python
    text = load_text()
    len(text["train"]) > 10 * len(text["test"])  # True
    ```
    """
    if source == "stdlib":
        return dict(_stdlib_docstrings())
    if source in _CORPORA:
        source = _download(source)
    elif not os.path.isfile(source):
        raise ValueError(
            f"`source` must be 'stdlib', a text file or one of "
            f"{sorted(_CORPORA)}; got {source!r}"
        )
    with open(source, "rb") as f:
        data = f.read()
    cuts = [0, int(0.9 * len(data)), int(0.95 * len(data)), len(data)]
    return {
        split: data[start:end]
        for split, start, end in zip(_SPLITS, cuts[:-1], cuts[1:], strict=True)
    }


def _download(name):
    url = _CORPORA[name]
    if not url.endswith(".zip"):
        return keras.utils.get_file(f"{name}.txt", url)
    folder = keras.utils.get_file(f"{name}.zip", url, extract=True)
    return os.path.join(folder, name)


@functools.lru_cache(maxsize=1)  # parsing every module takes seconds
def _stdlib_docstrings():
    root = sysconfig.get_paths()["stdlib"]
    parts = {split: [] for split in _SPLITS}
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(set(subfolders) - _NOT_STDLIB)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            module = os.path.relpath(path, root).replace(os.sep, "/")
            text = _docstrings(path)
            if text:
                bucket = zlib.crc32(module.encode()) % 20
                split = {0: "test", 1: "validation"}.get(bucket, "train")
                parts[split].append(text)
    return {k: "\n\n".join(v).encode() for k, v in parts.items()}


def _docstrings(path):
    """A module's docstrings (module, classes, functions) in source order."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ""  # a file of another Python version or encoding
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = [n for n in ast.walk(tree) if isinstance(n, kinds)]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    texts = (ast.get_docstring(n) for n in nodes)
    return "\n\n".join(t for t in texts if t)


def mqar(num_examples, sequence_length, num_pairs, vocabulary_size, seed=0):
    """Multi-query associative recall, as Zoology (Arora et al. 2023) poses it.

    Keys come from tokens `[1, V/2)`, values from `[V/2, V)`. Each sequence
    opens with `num_pairs` pairs `k_1 v_1 ... k_P v_P` (distinct keys,
    distinct values); after them, every key appears once more, as a query,
    at an even offset `2 g` into the rest of the sequence, the gaps `g`
    drawn without replacement with probability proportional to
    `g^(alpha - 1)`, `alpha = 0.01` (short gaps more likely). The target at
    a query is the token that follows it: its key's value. Every other
    position holds a random token and no target (`weights` 0). A model
    solves the task only if each query retrieves its pair from the context.

    Args:
        num_examples: int.
        sequence_length: int. `T`, even, at least `4 * num_pairs`.
        num_pairs: int. `P`, key/value pairs per sequence.
        vocabulary_size: int. `V`, larger than `T` and than `2 * P + 1`.
        seed: int. The NumPy generator's seed.

    Returns:
        `(inputs, targets, weights)`: int32 `(N, T)` tokens, int32 `(N, T)`
        next tokens to predict, float32 `(N, T)` with 1 at the `P` queries.

    Raises:
        ValueError: the sizes do not fit (the message names which).

    Example:
    ```python
    x, y, w = mqar(2, 64, 8, 128)
    (x.shape, int(w.sum()))  # ((2, 64), 16)
    ```
    """
    if sequence_length % 2 or sequence_length < 4 * num_pairs:
        raise ValueError(
            "`sequence_length` must be even and at least 4 * num_pairs "
            f"({4 * num_pairs}); got {sequence_length}"
        )
    if vocabulary_size <= max(sequence_length, 2 * num_pairs + 1):
        raise ValueError(
            "`vocabulary_size` must exceed sequence_length and "
            f"2 * num_pairs + 1; got {vocabulary_size}"
        )
    rng = np.random.default_rng(seed)
    half, context = vocabulary_size // 2, 2 * num_pairs
    gaps = np.arange(1, (sequence_length - context) // 2 + 1)
    p = gaps ** (0.01 - 1.0)
    inputs = rng.integers(0, vocabulary_size, (num_examples, sequence_length))
    targets = np.zeros((num_examples, sequence_length), "int32")
    weights = np.zeros((num_examples, sequence_length), "float32")
    for row in range(num_examples):
        keys = rng.choice(np.arange(1, half), num_pairs, replace=False)
        values = rng.choice(np.arange(half, vocabulary_size), num_pairs, False)
        inputs[row, 0:context:2], inputs[row, 1:context:2] = keys, values
        g = rng.choice(len(gaps), num_pairs, replace=False, p=p / p.sum())
        queries = context + 2 * g
        inputs[row, queries] = keys
        targets[row, queries], weights[row, queries] = values, 1.0
    return inputs.astype("int32"), targets, weights
