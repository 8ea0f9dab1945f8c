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


def causal_rows(prefix, num_queries):
    """Row `min(i, S - 1)` of `prefix` (axis 1, length S) for each query i.

    Turns per-key prefix quantities (running sums or counts over keys
    `0..j`) into what causal query `i` sees: keys `0..i`, or all S keys
    when `i >= S`. Returns axis 1 of length T = `num_queries`.
    """
    length = prefix.shape[1]
    return ops.take(
        prefix, ops.minimum(ops.arange(num_queries), length - 1), axis=1
    )


def causal_mask(num_queries, num_keys, offset=0):
    """Lower-triangular mask `(1, T, S)`: query `i` sees key `j` iff
    `j <= i + offset`.

    The same convention as `keras.layers.MultiHeadAttention`; `offset` (an
    int or int tensor) places query 0 at key position `offset`, as in cached
    decoding.

    >>> tuple(causal_mask(3, 4).shape)
    (1, 3, 4)
    """
    rows, cols = _positions(num_queries, num_keys)
    if not isinstance(offset, int) or offset:
        rows = rows + ops.cast(offset, "int32")
    return ops.greater_equal(rows, cols)


def local_window_mask(num_queries, num_keys, window):
    """Band mask `(1, T, S)`: query `i` sees key `j` iff `|i - j| < window`.

    >>> tuple(local_window_mask(5, 5, 2).shape)
    (1, 5, 5)
    """
    rows, cols = _positions(num_queries, num_keys)
    return ops.less(ops.abs(rows - cols), window)


def strided_mask(num_queries, num_keys, stride):
    """The "strided" pattern of Child et al. (2019), both heads' union.

    Query i sees key j when `|i - j| < stride` (the local head) or
    `(i - j) % stride == 0` (the strided head). Combine with a causal mask
    for the autoregressive form.
    """
    rows, cols = _positions(num_queries, num_keys)
    return ops.logical_or(
        ops.less(ops.abs(rows - cols), stride),
        ops.equal((rows - cols) % stride, 0),
    )


def fixed_mask(num_queries, num_keys, block, num_summary=1):
    """The "fixed" pattern of Child et al. (2019), both heads' union.

    Query i sees key j when both lie in the same block of `block` tokens, or
    j is one of the last `num_summary` tokens of its block (the summary
    columns every query attends to).
    """
    rows, cols = _positions(num_queries, num_keys)
    same_block = ops.equal(rows // block, cols // block)
    summary = ops.greater_equal(cols % block, block - num_summary)
    return ops.logical_or(same_block, summary)


SPARSITY = ("local", "strided", "fixed")


def sparse_mask(sparsity, num_queries, num_keys, block_size):
    """The `(1, T, S)` mask of a named sparse pattern (see `SPARSITY`)."""
    if sparsity == "local":
        return local_window_mask(num_queries, num_keys, block_size)
    if sparsity == "strided":
        return strided_mask(num_queries, num_keys, block_size)
    if sparsity == "fixed":
        return fixed_mask(num_queries, num_keys, block_size)
    raise ValueError(
        f"`sparsity` must be one of {SPARSITY}. Received: sparsity={sparsity!r}"
    )


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


def causal_valid_keys(query_mask, key_mask, num_queries, num_keys):
    """`(B|1, S)` keys some valid query may see under a causal mask.

    Key j is valid when `key_mask` allows it and a valid query i >= j
    exists: j <= the last valid query (T - 1 without `query_mask`). The
    same keys as `valid_keys` of the merged `(B, T, S)` mask, without
    forming it. None when every key is valid.

    Args:
        query_mask: `(B, T)` query padding, or None.
        key_mask: `(B|1, 1, S)` key constraints, or None.
    """
    if query_mask is None:
        if key_mask is None and num_queries >= num_keys:
            return None
        last = ops.full((1, 1), num_queries - 1, "int32")
    else:
        positions = ops.arange(num_queries, dtype="int32")[None]
        last = ops.max(
            ops.where(ops.cast(query_mask, "bool"), positions, -1),
            axis=1,
            keepdims=True,
        )
    reachable = ops.arange(num_keys, dtype="int32")[None] <= last
    if key_mask is None:
        return reachable
    return ops.logical_and(ops.cast(key_mask[:, 0], "bool"), reachable)
