"""Attention maps per layer and head, and the head-redundancy measure."""

import keras
import numpy as np

from keras_svr_attention.models.encoder import TransformerEncoderBlock


def attention_maps(model, inputs, batch_size=64):
    """Attention weights of every `TransformerEncoderBlock` of `model`.

    Args:
        model: a functional model built from `TransformerEncoderBlock`s.
        inputs: what `model.predict` takes.

    Returns:
        A list, one entry per block in order, of NumPy arrays
        `(B, N, T, T)`. Pooled (SH) heads are spread back over the tokens,
        so every head's map covers the same T x T grid.
    """
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
        maps.append(np.concatenate(scores, axis=0))
    return maps


def head_redundancy(maps, padding_mask=None):
    """Mean L2 distance between the attention maps of different heads.

    For one sample and one layer with head maps A_1..A_N (each T x S, rows
    summing to 1 over the keys):

    ```text
    R = mean over pairs h < h' of  sqrt( mean_i ||A_h[i] - A_h'[i]||_2^2 )
    ```

    i.e. the root-mean-square over query rows of the L2 distance between
    two heads' attention distributions; then the mean over samples and
    layers. Higher means more diverse heads. SH heads are compared through
    their maps spread back onto the tokens, so softmax and SH heads are on
    the same scale. Rows of padded queries (`padding_mask` False) are left
    out.

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
