"""Masked sequence pooling of Attention-SH (SPEC.md sections 3 and 6, Eqn 25).

Head s fits its SVR on keys and values average-pooled by a factor r along
the sequence. With p prefix tokens, the pooled sequence is

```text
x'_j     = x_j                                   for j < p (prefix tokens)
x'_{p+w} = sum_{j in W_w} m_j x_j / max(sum_{j in W_w} m_j, 1)
W_w      = [p + w r, min(p + (w + 1) r, S)),    w = 0 .. ceil((S - p) / r) - 1
```

where m_j marks valid tokens (not padding, visible to some query). Window
sums and counts are accumulated in float32.
"""

from typing import NamedTuple

from keras import ops

from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional.statistics import accumulation_dtype


def pooled_length(length, factor, num_prefix_tokens=0):
    """p + ceil((S - p) / r): length of the pooled sequence."""
    rest = length - num_prefix_tokens
    return num_prefix_tokens + (rest + factor - 1) // factor


def split_windows(x, factor, num_prefix_tokens=0):
    """Splits axis 1 into the prefix and zero-padded windows of `factor`.

    `(B, S, ...)` -> `prefix (B, p, ...)`, `windows (B, W, r, ...)` with
    W = ceil((S - p) / r); the last, shorter window is zero-padded.
    """
    p = num_prefix_tokens
    length = masks_lib.shape_of(x)[1]
    prefix, rest = x[:, :p], x[:, p:]
    pad = (-(length - p)) % factor
    if pad:
        widths = [[0, 0]] * len(x.shape)
        widths[1] = [0, pad]
        rest = ops.pad(rest, widths)
    shape = masks_lib.shape_of(rest)
    windows = (length - p + pad) // factor
    return prefix, ops.reshape(rest, (shape[0], windows, factor, *shape[2:]))


def window_sum(x, factor, num_prefix_tokens=0, axis=1):
    """Sums `x` over the windows of `axis`; prefix entries pass through.

    `(..., S, ...)` -> `(..., p + ceil((S - p) / r), ...)`.
    """
    x = ops.moveaxis(x, axis, 1) if axis != 1 else x
    prefix, windows = split_windows(x, factor, num_prefix_tokens)
    out = ops.concatenate([prefix, ops.sum(windows, axis=2)], axis=1)
    return ops.moveaxis(out, 1, axis) if axis != 1 else out


def window_counts(valid, factor, num_prefix_tokens, length):
    """Valid tokens per pooled key: `(B|1, S)` -> `(B|1, S')` float32.

    Prefix tokens count 1 (0 when invalid); window w counts its valid
    tokens. `valid=None` means every token is valid.
    """
    if valid is None:
        weights = ops.ones((1, length), "float32")
    else:
        weights = ops.cast(valid, "float32")
    return window_sum(weights, factor, num_prefix_tokens)


def pool_sequence(x, factor, num_prefix_tokens=0, valid=None, counts=None):
    """Average-pools a sequence over windows of its valid tokens (Eqn 25).

    Args:
        x: `(B, S, ...)` inputs, or projected keys or values `(B, S, N, D)`:
            pooling commutes with the affine projections (the mean of
            x W + b over a window is the window's mean times W plus b).
        factor: int r >= 1.
        num_prefix_tokens: int p. Leading tokens that are never pooled.
        valid: `(B|1, S)` boolean, or `None` for all valid.
        counts: `window_counts(valid, ...)` when already at hand (a
            `HeadGroup`'s), or None to count here.

    Returns:
        `(pooled, counts)`: `(B, S', ...)` in `x.dtype`, and the number of
        valid tokens per window, `(B|1, S')` float32. An empty window pools
        to zeros (it is masked downstream).

    >>> x = ops.reshape(ops.arange(5.0), (1, 5, 1))
    >>> pooled, counts = pool_sequence(x, 2)
    >>> ops.convert_to_numpy(pooled)[0, :, 0].tolist()
    [0.5, 2.5, 4.0]
    """
    out_dtype, dtype = x.dtype, accumulation_dtype(x.dtype)
    length = masks_lib.shape_of(x)[1]
    if counts is None:
        counts = window_counts(valid, factor, num_prefix_tokens, length)
    trailing = (1,) * (len(x.shape) - 2)
    x = ops.cast(x, dtype)
    if valid is not None:
        x = x * ops.reshape(ops.cast(valid, dtype), (-1, length, *trailing))
    sums = window_sum(x, factor, num_prefix_tokens)
    safe = ops.maximum(ops.cast(counts, dtype), 1.0)
    pooled = sums / ops.reshape(safe, (*masks_lib.shape_of(safe), *trailing))
    return ops.cast(pooled, out_dtype), counts


def pool_mask(mask, factor, num_prefix_tokens=0, pending=None):
    """Mask of the pooled keys (SPEC.md section 6).

    Query i sees window w when w holds at least one valid token and i may
    see every valid token of w. A key is valid when some query may see it,
    or when it is `pending`: a cache slot that later tokens will fill, so a
    window that reaches past the current tokens is not complete yet.

    Args:
        mask: boolean `(B|1, T|1, S)` with every constraint merged in
            (padding, causal, sparse).
        pending: `(B|1, S)` boolean keys still to come, or None.

    Returns:
        `(pooled_mask, valid)`: `(B|1, T|1, S')` boolean and the `(B|1, S)`
        validity of the original keys.
    """
    dtype = "float32"
    valid = masks_lib.valid_keys(mask)
    if pending is not None:
        valid = ops.logical_or(valid, ops.expand_dims(pending, 1))
    blocked = ops.cast(ops.logical_and(valid, ops.logical_not(mask)), dtype)
    num_blocked = window_sum(blocked, factor, num_prefix_tokens, axis=2)
    num_valid = window_sum(
        ops.cast(valid, dtype), factor, num_prefix_tokens, axis=2
    )
    pooled = ops.logical_and(num_valid > 0, num_blocked == 0)
    return pooled, ops.squeeze(valid, axis=1)


def spread_scores(scores, factor, num_prefix_tokens, counts, valid, length):
    """Spreads pooled attention weights back over the unpooled keys.

    A window's weight is shared evenly by its valid tokens, so that
    `spread @ v` equals `scores @ pool(v)` exactly.

    Args:
        scores: `(B, N, T, S')` weights over pooled keys.
        counts: `(B|1, S')` valid tokens per window (`pool_sequence`).
        valid: `(B|1, S)` boolean or `None`.
        length: int S.

    Returns:
        `(B, N, T, S)` in `scores.dtype`.
    """
    p = num_prefix_tokens
    dtype = accumulation_dtype(scores.dtype)
    per_token = (
        ops.cast(scores, dtype) / ops.maximum(counts, 1.0)[:, None, None, :]
    )
    out = repeat_windows(per_token, factor, p, length)
    if valid is not None:
        out = out * ops.cast(valid, dtype)[:, None, None, :]
    return ops.cast(out, scores.dtype)


def repeat_windows(x, factor, num_prefix_tokens, length):
    """Each pooled entry of the last axis repeated over its window's keys.

    `(..., p + ceil((S - p) / r))` -> `(..., S)`: prefix entries pass
    through, window w's entry fills keys p + w r ... p + (w + 1) r - 1.
    """
    p = num_prefix_tokens
    rest = ops.repeat(x[..., p:], factor, axis=-1)[..., : length - p]
    return ops.concatenate([x[..., :p], rest], axis=-1)


def ready_positions(valid, factor, num_prefix_tokens, length):
    """Where each pooled key becomes visible to a causal query.

    Window w is "ready" at its last valid token (SPEC.md section 6: a query
    sees a window when it may see every valid token of it), or at its last
    token when it holds none (it is masked anyway). Ready positions strictly
    increase with w, so the windows a causal query i sees are a prefix, of
    length `cumsum(ready)[i]`.

    Args:
        valid: `(B|1, S)` boolean, or None for all valid.
        length: int S.

    Returns:
        `(B|1, S)` float32 0/1 with exactly one 1 per pooled key.
    """
    p = num_prefix_tokens
    if valid is None:
        valid = ops.ones((1, length), "bool")
    valid = ops.cast(valid, "float32")
    _, rest = split_windows(valid, factor, p)
    windows = masks_lib.shape_of(rest)[1]
    # Valid tokens from each position to the end of its window.
    after = ops.flip(ops.cumsum(ops.flip(rest, axis=-1), axis=-1), axis=-1)
    last_valid = rest * ops.cast(after == 1, "float32")
    position = ops.reshape(ops.arange(windows * factor), (windows, factor))
    real = position < length - p
    last_real = ops.logical_and(
        real,
        ops.logical_or(
            (position + 1) % factor == 0, position + 1 == length - p
        ),
    )
    empty = ops.cast(ops.sum(rest, axis=-1, keepdims=True) == 0, "float32")
    ready = last_valid + empty * ops.cast(last_real, "float32")[None]
    ready = ops.reshape(ready, (-1, windows * factor))[:, : length - p]
    prefix = ops.ones_like(valid[:, :p])
    return ops.concatenate([prefix, ready], axis=1)


def causal_window_mask(
    valid, counts, factor, num_prefix_tokens, num_queries, length
):
    """Mask of the pooled keys under causality, without a `(T, S)` mask.

    The `pool_mask` of a causal mask merged with key validity: query i sees
    window w when w holds a valid token and is ready (`ready_positions`) at
    or before i. Windows become ready in order, so query i sees the first
    `cumsum(ready)[i]` windows. Rows of padded queries are not cleared.

    Args:
        valid: `(B|1, S)` boolean keys some query may see, or None.
        counts: `(B|1, S')` valid tokens per window (`pool_sequence`).
        num_queries: int T. length: int S.

    Returns:
        `(B|1, T, S')` boolean.
    """
    ready = ready_positions(valid, factor, num_prefix_tokens, length)
    seen = visible_counts(ready, num_queries)
    windows = ops.arange(masks_lib.shape_of(counts)[1], dtype="int32")
    return ops.logical_and(
        windows[None, None, :] < seen[:, :, None], (counts > 0)[:, None, :]
    )


def visible_counts(ready, num_queries):
    """Causal prefix lengths: n_i = number of keys ready at or before i.

    Args:
        ready: `(B|1, S)` 0/1 per token position (`ready_positions`, or
            all ones for unpooled keys).

    Returns:
        `(B|1, T)` int32.
    """
    counts = ops.cumsum(ops.cast(ready, "int32"), axis=1)
    return masks_lib.causal_rows(counts, num_queries)


class HeadGroup(NamedTuple):
    """The heads that share one pooling factor, and what their SVRs see.

    Attributes:
        factor: int. Pooling factor applied to this group's keys and values
            (1: unpooled; also 1 when only prefix tokens are left to pool).
        heads: tuple of int. The group's heads, in the layer's head order.
        valid: `(B|1, S)` boolean validity of the unpooled keys (the pooling
            weights), or None when every key is valid.
        counts: `(B|1, S')` float32 valid tokens per pooled key, or None for
            an unpooled group.
        mask: softmax kernel: boolean `(B|1, T|1, S')` mask over the group's
            keys (query padding included), or None.
        causal: softmax kernel: bool, whether the kernel must also apply
            j <= i itself (an unpooled group under `use_causal_mask`).
        key_weights: linear kernel: `(B|1, S')` 0/1 valid keys, or None.
        visible: linear kernel under causality: `(B|1, T)` int32 prefix
            lengths n_i (query i sees keys 0..n_i - 1), or None.
    """

    factor: int
    heads: tuple
    valid: object = None
    counts: object = None
    mask: object = None
    causal: bool = False
    key_weights: object = None
    visible: object = None


def group_heads(head_factors):
    """Heads grouped by factor, in order of first appearance.

    >>> group_heads([1, 2, 1, 4])
    [(1, (0, 2)), (2, (1,)), (4, (3,))]
    """
    groups = {}
    for head, factor in enumerate(head_factors):
        groups.setdefault(factor, []).append(head)
    return [(factor, tuple(heads)) for factor, heads in groups.items()]


def plan_head_groups(
    head_factors,
    num_prefix_tokens,
    num_queries,
    num_keys,
    query_mask=None,
    key_mask=None,
    causal=False,
    kernel="softmax",
    pending=None,
):
    """Plans every head group of an SVR attention call (SPEC.md sections 3, 6).

    One place for what Attention-SH changes: which keys each group pools,
    the validity of the keys behind each window, and the mask (softmax) or
    key weights and causal prefix lengths (linear) over the pooled keys.
    Query i sees pooled key w when w holds a valid token and i may see
    every valid token of w.

    Args:
        head_factors: sequence of int >= 1, one per head.
        num_prefix_tokens: int p. Leading keys that are never pooled.
        num_queries, num_keys: ints T and S.
        query_mask: `(B, T)` query padding, or None.
        key_mask: boolean `(B|1, T|1, S)`: every constraint but the query
            padding and causality (key padding, attention mask, sparse
            pattern, sliding window), or None. The linear kernel takes
            `(B|1, 1, S)` only.
        causal: bool. Query i sees only keys j <= i.
        kernel: "softmax" or "linear".
        pending: `(B|1, S)` boolean cache slots not written yet (cached
            decoding), or None. They count as valid keys that no current
            query sees, so a window reaching into them is incomplete: the
            same windows as in the full causal forward.

    Returns:
        A list of `HeadGroup`, one per distinct factor.

    >>> [g.factor for g in plan_head_groups([1, 2, 2, 4], 0, 6, 6)]
    [1, 2, 4]
    """
    p = num_prefix_tokens
    groups = group_heads(head_factors)
    nothing_to_pool = isinstance(num_keys, int) and num_keys <= p
    if nothing_to_pool:
        groups = [(1, heads) for _, heads in groups]
    pooled = any(factor > 1 for factor, _ in groups)
    if kernel == "linear":
        return _plan_linear(
            groups, p, num_queries, num_keys, query_mask, key_mask, causal
        )
    rows = masks_lib.query_padding_mask(query_mask)
    mask = masks_lib.broadcast_keys(
        masks_lib.merge_masks(rows, key_mask), num_keys
    )
    full_mask = valid = None
    if pooled and causal:
        if key_mask is not None and key_mask.shape[1] != 1:
            # Row-dependent constraints: pool the merged (B, T, S) mask.
            full_mask = masks_lib.merge_masks(
                mask, masks_lib.causal_mask(num_queries, num_keys)
            )
        else:
            # Causal windows from the keys' validity alone, O(T S / r).
            valid = masks_lib.causal_valid_keys(
                query_mask, key_mask, num_queries, num_keys
            )
    elif pooled:
        full_mask = mask
    plan = []
    for factor, heads in groups:
        if factor == 1:
            plan.append(HeadGroup(1, heads, mask=mask, causal=causal))
            continue
        if full_mask is not None:
            group_mask, group_valid = pool_mask(full_mask, factor, p, pending)
        else:
            group_mask, group_valid = None, valid
        counts = window_counts(group_valid, factor, p, num_keys)
        if full_mask is None and causal:
            group_mask = masks_lib.merge_masks(
                rows,
                causal_window_mask(
                    group_valid, counts, factor, p, num_queries, num_keys
                ),
            )
        plan.append(
            HeadGroup(factor, heads, group_valid, counts, mask=group_mask)
        )
    return plan


def _plan_linear(
    groups, p, num_queries, num_keys, query_mask, key_mask, causal
):
    if causal:
        valid = masks_lib.causal_valid_keys(
            query_mask, key_mask, num_queries, num_keys
        )
    else:
        valid = None if key_mask is None else key_mask[:, 0]
    plan = []
    for factor, heads in groups:
        counts = None
        if factor == 1:
            weights, ready = valid, ops.ones((1, num_keys))
        else:
            counts = window_counts(valid, factor, p, num_keys)
            weights = counts > 0
            ready = ready_positions(valid, factor, p, num_keys)
        visible = visible_counts(ready, num_queries) if causal else None
        plan.append(
            HeadGroup(
                factor,
                heads,
                valid,
                counts,
                key_weights=weights,
                visible=visible,
            )
        )
    return plan
