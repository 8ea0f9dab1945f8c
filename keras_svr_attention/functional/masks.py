"""Attention masks: builders and a None-tolerant merge.

All masks are boolean, `True` where query `i` may attend to key `j`, of a
shape that broadcasts to `(B, T, S)`: `(B, 1, S)` for key padding,
`(B, T, 1)` for query padding, `(1, T, S)` for a pattern shared by the batch.
"""

from keras import ops

from keras_svr_attention.functional._tensors import floor_mod
from keras_svr_attention.functional._tensors import positions


def merge_masks(*masks):
    """Logical AND of the masks that are not `None`; `None` if all are."""
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def _positions(num_queries, num_keys, offset=0):
    rows = ops.reshape(positions(num_queries, offset), (1, -1, 1))
    cols = ops.reshape(positions(num_keys), (1, 1, -1))
    return rows, cols


def causal_mask(num_queries, num_keys, offset=0):
    """Lower-triangular mask `(1, T, S)`: query `i` sees key `j` iff
    `j <= i + offset`.

    The same convention as `keras.layers.MultiHeadAttention`; `offset`
    places query 0 at key position `offset`, as in cached decoding.

    Examples:
        >>> tuple(causal_mask(3, 4).shape)
        (1, 3, 4)
    """
    rows = ops.reshape(positions(num_queries, offset), (1, -1, 1))
    return rows >= ops.reshape(positions(num_keys), (1, 1, -1))


def local_window_mask(num_queries, num_keys, window, offset=0):
    """Band mask `(1, T, S)`: query `i` sees key `j` iff
    `|i + offset - j| < window`.

    Examples:
        >>> tuple(local_window_mask(5, 5, 2).shape)
        (1, 5, 5)
    """
    rows, cols = _positions(num_queries, num_keys, offset)
    return ops.less(ops.abs(rows - cols), window)


def strided_mask(num_queries, num_keys, stride, offset=0):
    """The "strided" pattern of Child et al. (2019), both heads' union.

    Query i sees key j when `|i - j| < stride` (the local head) or
    `(i - j) % stride == 0` (the strided head). Combine with a causal mask
    for the autoregressive form.
    """
    rows, cols = _positions(num_queries, num_keys, offset)
    return ops.logical_or(
        ops.less(ops.abs(rows - cols), stride),
        ops.equal(floor_mod(rows - cols, stride), 0),
    )


def fixed_mask(num_queries, num_keys, block, num_summary=1, offset=0):
    """The "fixed" pattern of Child et al. (2019), both heads' union.

    Query i sees key j when both lie in the same block of `block` tokens, or
    j is one of the last `num_summary` tokens of its block (the summary
    columns every query attends to).
    """
    rows, cols = _positions(num_queries, num_keys, offset)
    same_block = ops.equal(
        ops.floor_divide(rows, block), ops.floor_divide(cols, block)
    )
    summary = ops.greater_equal(floor_mod(cols, block), block - num_summary)
    return ops.logical_or(same_block, summary)


SPARSITY = ("local", "strided", "fixed")
"""The sparse patterns `sparse_mask` builds (Child et al. 2019; local)."""


def sparse_mask(sparsity, num_queries, num_keys, block_size, offset=0):
    """The `(1, T, S)` mask of a named sparse pattern (see `SPARSITY`)."""
    if sparsity == "local":
        return local_window_mask(num_queries, num_keys, block_size, offset)
    if sparsity == "strided":
        return strided_mask(num_queries, num_keys, block_size, offset)
    if sparsity == "fixed":
        return fixed_mask(num_queries, num_keys, block_size, offset=offset)
    raise ValueError(
        f"`sparsity` must be one of {SPARSITY}. Received: sparsity={sparsity!r}"
    )
