"""The example scripts' own pieces that training relies on."""

import importlib.util
import os

import keras
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example(name):
    path = os.path.join(ROOT, "examples", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def image_example():
    return _example("image_classification")


def _coded_batch(n=8, size=8):
    """Image k is the constant k + 1 and has one-hot label k."""
    x = np.broadcast_to(
        np.arange(1, n + 1, dtype="float32")[:, None, None, None],
        (n, size, size, 1),
    ).copy()
    return x, np.eye(n, dtype="float32")


def _mixed(image_example, which, size):
    keras.utils.set_random_seed(1)
    x, y = _coded_batch(size=size)
    mixer = image_example.batch_mixers("keras")[which]
    batches = image_example.MixedBatches(x, y, 4, [mixer], seed=0)
    assert len(batches) == 2
    images, labels = zip(
        *(batches[i] for i in range(len(batches))), strict=True
    )
    images, labels = np.concatenate(images), np.concatenate(labels)
    np.testing.assert_allclose(labels.sum(-1), 1.0, atol=1e-5)
    assert np.any(labels.max(-1) < 0.95)  # the check sees real mixing
    return images, labels


def test_mixup_labels_weigh_the_blended_images(image_example):
    # Image k is the constant k + 1, so a blend of images is the constant
    # sum_k label_k * (k + 1).
    images, labels = _mixed(image_example, 0, size=8)
    codes = np.arange(1, labels.shape[1] + 1, dtype="float32")
    np.testing.assert_allclose(
        images.mean(axis=(1, 2, 3)), labels @ codes, atol=1e-4
    )


def test_cutmix_labels_weigh_the_pasted_area(image_example):
    # The share of image i's pixels taken from image k is label_k. Keras's
    # CutMix weighs labels by the continuous box area and pastes whole
    # pixels, so they may differ by one pixel row and column:
    # (2 * size + 1) / size**2.
    size = 32
    images, labels = _mixed(image_example, 1, size=size)
    codes = np.arange(1, labels.shape[1] + 1, dtype="float32")
    share = (images[..., 0][:, None] == codes[None, :, None, None]).mean(
        axis=(2, 3)
    )
    np.testing.assert_allclose(share, labels, atol=(2 * size + 1) / size**2)


def test_mixed_batches_cover_every_image_once_per_epoch(image_example):
    x, y = _coded_batch(n=10)

    def identity(batch):
        return batch

    batches = image_example.MixedBatches(x, y, 4, [identity], seed=0)
    for _ in range(2):
        seen = np.concatenate([batches[i][1] for i in range(len(batches))])
        np.testing.assert_array_equal(np.sort(seen.argmax(-1)), np.arange(10))
        first = batches.order.copy()
        batches.on_epoch_end()
    assert not np.array_equal(first, batches.order)
