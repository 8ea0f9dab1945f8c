"""Attention maps per layer and head, and the head-redundancy measure."""

import keras
import numpy as np

from keras_svr_attention.functional import pooling
from keras_svr_attention.models.encoder import TransformerEncoderBlock

POOLED_VIEWS = ("shared", "window")
"""The values of `attention_maps(..., pooled_view=...)`."""


def attention_maps(model, inputs, batch_size=64, pooled_view="shared"):
    """Attention weights of every `TransformerEncoderBlock` of `model`.

    A pooled (SH) head with factor r attends to windows of r keys. Its map
    is brought onto the same T x T grid as the other heads' in one of two
    ways (`pooled_view`):

    - `"shared"`: a window's weight is shared evenly by its valid tokens,
      A[i, j] = P[i, w(j)] / n_w(j). Rows sum to 1 and `A @ V` is the
      head's output; this is what `return_attention_scores` gives.
    - `"window"`: every token shows its whole window's weight,
      A[i, j] = P[i, w(j)]: the pooled map P repeated r times along the
      keys. Rows sum to about r.

    Args:
        model: a functional model built from `TransformerEncoderBlock`s.
        inputs: what `model.predict` takes.
        batch_size: int. Samples per forward pass. Defaults to 64.
        pooled_view: `"shared"` or `"window"`, as above. Defaults to
            `"shared"`.

    Returns:
        A list, one entry per block in order, of NumPy arrays
        `(B, N, T, T)`.
    """
    if pooled_view not in POOLED_VIEWS:
        raise ValueError(
            f"`pooled_view` must be one of {POOLED_VIEWS}. "
            f"Received: pooled_view={pooled_view!r}"
        )
    blocks = [
        layer
        for layer in model.layers
        if isinstance(layer, TransformerEncoderBlock)
    ]
    if not blocks:
        raise ValueError(
            "`model` has no TransformerEncoderBlock. Received: "
            f"model={model.name!r}"
        )
    # One forward pass gives every block's inputs.
    probe = keras.Model(model.inputs, [block.input for block in blocks])
    block_inputs = probe.predict(inputs, batch_size=batch_size, verbose=0)
    if len(blocks) == 1:  # one output comes back unwrapped
        block_inputs = [block_inputs]
    maps = []
    for block, block_input in zip(blocks, block_inputs, strict=True):
        if isinstance(block_input, (list, tuple)):
            x, padding_mask = block_input
        else:
            x, padding_mask = block_input, None
        scores = []
        for start in range(0, len(x), batch_size):
            end = start + batch_size
            mask = None if padding_mask is None else padding_mask[start:end]
            scores.append(
                keras.ops.convert_to_numpy(
                    block.attention_scores(x[start:end], padding_mask=mask)
                ).astype("float32")
            )
        scores = np.concatenate(scores, axis=0)
        if pooled_view == "window":
            scores = _window_weights(
                block.attention_layer, scores, padding_mask
            )
        maps.append(scores)
    return maps


def _window_weights(layer, scores, padding_mask):
    """Multiplies each pooled head's shared map by its windows' counts."""
    factors = getattr(layer, "head_factors", None) or [1] * scores.shape[1]
    prefix = getattr(layer, "num_prefix_tokens", 0)
    length = scores.shape[-1]
    valid = None if padding_mask is None else np.asarray(padding_mask, bool)
    out = scores.copy()
    for head, factor in enumerate(factors):
        if factor == 1:
            continue
        counts = pooling.window_counts(valid, factor, prefix, length)
        per_key = pooling.repeat_windows(counts, factor, prefix, length)
        out[:, head] *= keras.ops.convert_to_numpy(per_key)[:, None, :]
    return out


def head_redundancy(maps, padding_mask=None):
    """Mean L2 distance between the attention maps of different heads.

    For one sample and one layer with head maps A_1..A_N (each T x S, rows
    summing to 1 over the keys):

    ```text
    R = mean over pairs h < h' of  sqrt( mean_i ||A_h[i] - A_h'[i]||_2^2 )
    ```

    i.e. the root-mean-square over query rows of the L2 distance between
    two heads' attention distributions; then the mean over samples and
    layers. Higher means more diverse heads. Pooled (SH) heads enter
    through whichever view of their maps `attention_maps` gave
    (`pooled_view`): with `"shared"` (the default) every row is a
    distribution over the same tokens, so softmax and SH heads are on one
    scale; with `"window"` a head pooling by r has entries about r times
    larger, so pooled heads count as more distant. Rows of padded queries
    (`padding_mask` False) are left out.

    Args:
        maps: an array `(B, N, T, S)` or a list of them (one per layer).
        padding_mask: `(B, T)` boolean or None.

    Returns:
        float.
    """
    maps = maps if isinstance(maps, (list, tuple)) else [maps]
    values = []
    for a in maps:
        a = np.asarray(a, "float64")
        b, n, t, _ = a.shape
        rows = (
            np.ones((b, t), bool)
            if padding_mask is None
            else np.asarray(padding_mask, bool)
        )
        count = np.maximum(rows.sum(-1), 1)
        for h in range(n):
            for g in range(h + 1, n):
                sq = ((a[:, h] - a[:, g]) ** 2).sum(-1)  # (B, T)
                values.append(np.sqrt((sq * rows).sum(-1) / count))
    return float(np.mean(np.concatenate(values)))
