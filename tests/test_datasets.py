"""load_uea against aeon's arrays, padded and patched by hand."""

import numpy as np
import pytest

aeon = pytest.importorskip("aeon")
from aeon.datasets import load_classification  # noqa: E402

from keras_svr_attention import datasets  # noqa: E402


def _by_hand(name, patch=1):
    """Loops: pad, patch-average the real steps, standardize on train."""
    x_train, y_train = load_classification(name, split="train")
    x_test, y_test = load_classification(name, split="test")
    series = [np.asarray(s, "float64").T for s in [*x_train, *x_test]]
    length = -(-max(len(s) for s in series) // patch)
    x = np.zeros((len(series), length, series[0].shape[1]))
    mask = np.zeros((len(series), length), bool)
    for i, s in enumerate(series):
        for t in range(length):
            window = s[t * patch : (t + 1) * patch]
            if len(window):
                x[i, t], mask[i, t] = window.mean(0), True
    n = len(x_train)
    real = x[:n][mask[:n]]
    x = (x - real.mean(0)) / (real.std(0) + 1e-6) * mask[..., None]
    return x, mask, n, [*y_train, *y_test]


@pytest.mark.parametrize(
    "name, max_length, patch",
    [("JapaneseVowels", None, 1), ("PickupGestureWiimoteZ", 100, 4)],
)
def test_load_uea_pads_masks_patches_and_standardizes(name, max_length, patch):
    train, test, classes = datasets.load_uea(name, max_length)
    x, mask, n, labels = _by_hand(name, patch)
    np.testing.assert_allclose(
        np.concatenate([train[0], test[0]]), x, atol=1e-4
    )
    np.testing.assert_array_equal(np.concatenate([train[1], test[1]]), mask)
    assert len(train[2]) == n and train[0].dtype == np.float32
    got = [classes[i] for i in np.concatenate([train[2], test[2]])]
    assert got == [str(c) for c in labels]
    loaded = np.concatenate([train[1], test[1]])
    assert loaded.sum(1).min() >= 1  # every series keeps a real step


def test_shipped_sets_load_offline_and_others_fail_in_one_line():
    shipped = datasets.shipped_classification_sets()
    assert {"JapaneseVowels", "BasicMotions", "GunPoint"} <= set(shipped)
    assert "Covid3Month" not in shipped  # a regression set
    with pytest.raises(ValueError, match="not one of the sets inside aeon"):
        datasets.load_uea("NoSuchSet")
