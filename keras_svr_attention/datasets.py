"""UEA/UCR time-series classification sets as padded, masked arrays.

aeon is an optional dependency (`pip install -e ".[examples]"`), imported
inside the functions.
"""

import math
import os

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
