"""Attention maps and head redundancy (`diagnostics.heads`) by hand."""

import numpy as np
import pytest

import keras_svr_attention as ksa


def test_attention_maps_cover_every_block_and_head():
    model = ksa.timeseries_classifier(
        9, 3, 2, attention="bn+sh", width=16, depth=2
    )
    x = np.random.default_rng(0).normal(size=(5, 9, 3)).astype("float32")
    mask = np.arange(9)[None] < np.array([[9], [5], [9], [3], [7]])
    maps = ksa.attention_maps(model, [x, mask], batch_size=2)
    assert [m.shape for m in maps] == [(5, 8, 9, 9)] * 2
    sums = maps[0].sum(-1)  # (B, N, T)
    np.testing.assert_allclose(sums.transpose(0, 2, 1)[mask], 1.0, atol=1e-5)
    assert np.all(
        maps[0][~mask[:, None, None, :].repeat(8, 1).repeat(9, 2)] == 0
    )


def test_head_redundancy_matches_hand_computation():
    eye = np.eye(3)[None]  # one head attends to itself
    shift = np.roll(np.eye(3), 1, axis=1)[None]
    maps = np.stack([eye, eye, shift], axis=1)  # (1, 3, 3, 3)
    # Pairs: (eye, eye) -> 0, (eye, shift) -> sqrt(2) twice.
    want = (0 + 2 * np.sqrt(2)) / 3
    assert ksa.head_redundancy(maps) == pytest.approx(want)
    assert ksa.head_redundancy([maps, maps]) == pytest.approx(want)
    mask = np.array([[True, True, False]])
    assert ksa.head_redundancy(maps, mask) == pytest.approx(want)


def test_window_view_gives_pooled_heads_their_windows_weight():
    model = ksa.timeseries_classifier(
        10, 3, 2, attention="bn+sh", width=16, depth=1, num_heads=4,
        head_factors=[1, 2, 3, 4],
    )  # fmt: skip
    x = np.random.default_rng(1).normal(size=(3, 10, 3)).astype("float32")
    mask = np.arange(10)[None] < np.array([[10], [7], [4]])
    (shared,) = ksa.attention_maps(model, [x, mask])
    (window,) = ksa.attention_maps(model, [x, mask], pooled_view="window")
    # By hand: key j of a head pooling by r lies in window j // r, whose
    # weight is shared by the window's real steps.
    for b in range(3):
        for h, r in enumerate([1, 2, 3, 4]):
            for j in range(10):
                real = mask[b, (j // r) * r : (j // r + 1) * r].sum()
                want = shared[b, h, :, j] * (real if mask[b, j] else 0)
                np.testing.assert_allclose(window[b, h, :, j], want, atol=1e-6)
    # With whole windows of real keys, a head's rows sum to its factor.
    sums = window[0].sum(-1)  # (N, T), series 0 has no padding
    np.testing.assert_allclose(sums[:2], [[1.0] * 10, [2.0] * 10], rtol=1e-5)
    with pytest.raises(ValueError, match="pooled_view"):
        ksa.attention_maps(model, [x, mask], pooled_view="spread")
