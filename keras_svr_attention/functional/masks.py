"""Attention masks: builders and a None-tolerant merge.

All masks are boolean, `True` where query `i` may attend to key `j`, of a
shape that broadcasts to `(B, T, S)`: `(B, 1, S)` for key padding,
`(B, T, 1)` for query padding, `(1, T, S)` for a pattern shared by the batch.
"""

from keras import ops


def shape_of(x):
    """Static sizes where known, dynamic (`ops.shape`) ones elsewhere."""
    dynamic = None
    out = []
    for i, d in enumerate(x.shape):
        if d is None:
            dynamic = ops.shape(x) if dynamic is None else dynamic
            d = dynamic[i]
        out.append(d)
    return tuple(out)


def merge_masks(*masks):
    """Logical AND of the masks that are not `None`; `None` if all are."""
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def padding_mask(mask):
    """Key padding mask `(B, S)` -> `(B, 1, S)`; `None` passes through."""
    if mask is None:
        return None
    return ops.expand_dims(ops.cast(mask, "bool"), axis=-2)


def query_padding_mask(mask):
    """Query padding mask `(B, T)` -> `(B, T, 1)`; `None` passes through."""
    if mask is None:
        return None
    return ops.expand_dims(ops.cast(mask, "bool"), axis=-1)


def _positions(num_queries, num_keys):
    rows = ops.reshape(ops.arange(num_queries, dtype="int32"), (1, -1, 1))
    cols = ops.reshape(ops.arange(num_keys, dtype="int32"), (1, 1, -1))
    return rows, cols


def causal_mask(num_queries, num_keys):
    """Lower-triangular mask `(1, T, S)`: query `i` sees key `j` iff `j <= i`.

    The same convention as `keras.layers.MultiHeadAttention`.

    >>> causal_mask(3, 4).shape
    (1, 3, 4)
    """
    rows, cols = _positions(num_queries, num_keys)
    return ops.greater_equal(rows, cols)


def local_window_mask(num_queries, num_keys, window, causal=False):
    """Band mask `(1, T, S)`: query `i` sees key `j` iff `|i - j| < window`.

    With `causal=True` only `0 <= i - j < window`.
    """
    rows, cols = _positions(num_queries, num_keys)
    mask = ops.less(ops.abs(rows - cols), window)
    if causal:
        mask = ops.logical_and(mask, ops.greater_equal(rows, cols))
    return mask


def broadcast_keys(mask, num_keys):
    """Broadcasts the last axis of a rank-3 mask to `num_keys`.

    A query padding mask `(B, T, 1)` becomes `(B, T, S)`; other axes keep
    their (possibly 1) sizes so that padding stays cheap.
    """
    if mask is None or mask.shape[-1] == num_keys:
        return mask
    shape = shape_of(mask)
    return ops.broadcast_to(mask, (shape[0], shape[1], num_keys))


def visible_rows(mask):
    """`(B|1, T|1, 1)`: whether each query row sees at least one key."""
    return ops.any(mask, axis=-1, keepdims=True)


def valid_keys(mask):
    """`(B|1, 1, S)`: keys that some query may see (SPEC section 6)."""
    return ops.any(mask, axis=-2, keepdims=True)
