"""Attention kernels: the support vector expansion evaluated at the queries.

Shape letters: B batch, T queries, S keys, N heads, D head dim.
"""

import keras
from keras import ops

from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional.statistics import accumulation_dtype


def _head_mask(mask):
    """`(B|1, T|1, S)` -> `(B|1, 1, T|1, S)` to broadcast over heads."""
    return None if mask is None else ops.expand_dims(mask, axis=1)


def softmax_attention(
    query,
    key,
    value,
    mask=None,
    is_causal=False,
    scale=None,
    dropout=None,
    return_scores=False,
    flash_attention=None,
):
    """Softmax attention, the SVR expansion with Phi(x)^T Phi(y) = exp(x^T y).

    ```text
    h_i = sum_j softmax_j(scale * q_i^T k_j  |  m_ij) v_j
    ```

    where m is `mask` (and j <= i when `is_causal`). Goes through the fused
    `keras.ops.dot_product_attention` when neither `dropout` nor the scores
    are needed; otherwise logits and softmax are computed in float32.

    Args:
        query: `(B, T, N, D)`.
        key: `(B, S, N, D)`.
        value: `(B, S, N, Dv)`.
        mask: boolean, broadcastable to `(B, T, S)`, or `None`.
        is_causal: bool. Query i sees only keys j <= i.
        scale: float. Defaults to `1 / sqrt(D)`.
        dropout: callable applied to the attention weights, or `None`.
        return_scores: bool. Also return the weights `(B, N, T, S)`.
        flash_attention: passed to `keras.ops.dot_product_attention`.

    Returns:
        `(output, scores)`: `(B, T, N, Dv)` in `query.dtype` and the weights
        before dropout (or `None`). A row with no visible key is exactly 0.

    >>> q = k = v = keras.ops.ones((2, 5, 3, 4))
    >>> softmax_attention(q, k, v)[0].shape
    (2, 5, 3, 4)
    """
    num_queries, num_keys = query.shape[1], key.shape[1]
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    rows = None
    # keras.ops.dot_product_attention needs equal query and value head dims
    # (the JAX kernel checks value against (B, S, N, D)), and JAX's computes
    # logits in float32, so float64 takes the explicit path.
    fused = query.shape[-1] == value.shape[-1]
    fused = fused and keras.backend.standardize_dtype(query.dtype) != "float64"
    fused = fused and dropout is None and not return_scores
    if is_causal and (mask is not None or not fused):
        mask = masks_lib.merge_masks(
            mask, masks_lib.causal_mask(num_queries, num_keys)
        )
        is_causal = False
    if mask is not None:
        mask = masks_lib.broadcast_keys(mask, num_keys)
        rows = masks_lib.visible_rows(mask)
        # A row that sees no key attends everywhere (finite on every
        # backend) and is zeroed below.
        mask = ops.logical_or(mask, ops.logical_not(rows))

    if fused:
        out = ops.dot_product_attention(
            query,
            key,
            value,
            mask=_head_mask(mask),
            scale=scale,
            is_causal=is_causal,
            flash_attention=flash_attention,
        )
        scores = None
    else:
        dtype = accumulation_dtype(query.dtype)
        logits = ops.einsum(
            "btnd,bsnd->bnts", ops.cast(query, dtype), ops.cast(key, dtype)
        )
        logits = logits * ops.cast(scale, dtype)
        if mask is not None:
            neg = ops.cast(-1e30 if dtype == "float32" else -1e300, dtype)
            logits = ops.where(_head_mask(mask), logits, neg)
        weights = ops.softmax(logits, axis=-1)
        if rows is not None:
            weights = ops.where(_head_mask(rows), weights, 0.0)
        scores = ops.cast(weights, query.dtype) if return_scores else None
        if dropout is not None:
            weights = ops.cast(dropout(weights), dtype)
        out = ops.einsum("bnts,bsnd->btnd", weights, ops.cast(value, dtype))
        out = ops.cast(out, query.dtype)
    if rows is not None:
        # (B|1, T|1, 1) -> (B|1, T|1, 1, 1) over (B, T, N, Dv).
        out = ops.where(ops.expand_dims(rows, -1), out, ops.zeros_like(out))
    return out, scores
