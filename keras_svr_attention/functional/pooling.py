"""Masked sequence pooling of Attention-SH (Eqn 25; the rules page,
"Windows").

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

from keras import ops

from keras_svr_attention.functional._tensors import accumulation_dtype
from keras_svr_attention.functional._tensors import concatenate
from keras_svr_attention.functional._tensors import shape_of
from keras_svr_attention.functional._tensors import zero_pad


def pooled_length(length, factor, num_prefix_tokens=0):
    """p + ceil((S - p) / r): length of the pooled sequence, plus one empty
    window at a symbolic S (`window_sum`)."""
    rest = length - num_prefix_tokens
    if not isinstance(length, int) and factor > 1:
        # The empty window, in the very expression of `window_sum`'s
        # slices (JAX's symbolic shapes compare expressions).
        rest = rest + factor
    return num_prefix_tokens + (rest + factor - 1) // factor


def window_sum(x, factor, num_prefix_tokens=0, axis=1):
    """Sums `x` over the windows of `axis`; prefix entries pass through.

    `(..., S, ...)` -> `(..., p + ceil((S - p) / r), ...)`: window w sums
    entries p + w r ... p + (w + 1) r - 1, the last window zero-padded.
    Works on an unknown (symbolic) S: the sum of r strided slices of x
    zero-padded by r - 1, slice j taking entries p + j, p + j + r, ...
    below S + j, so every slice has ceil((S - p) / r) entries by the same
    expression. No reshape into windows (an exporter tracing a length whose
    window count is 1 would fix that count for good), no padding of a
    computed size (which jax2onnx cannot place), and no slice x[:, p:] of
    its own (torch.export, tracing S = 2 with one prefix token, fixes S
    when a size S - p is 1).

    At a symbolic S, one empty window more (zero sum, zero count, masked
    like any window without a valid token): the pooled length is then
    never 1, which an exporter tracing a short sample (torch.export at
    length 2) would fix, or guard against, for good.
    """
    if factor == 1:
        return x
    p = num_prefix_tokens
    x = ops.moveaxis(x, axis, 1) if axis != 1 else x
    stop = shape_of(x)[1]
    empty = 0 if isinstance(stop, int) else factor
    padded = zero_pad(x, 1, after=factor - 1 + empty)
    stop = stop + empty
    out = padded[:, p:stop:factor]
    for j in range(1, factor):
        out = out + padded[:, p + j : stop + j : factor]
    out = concatenate([x[:, :p], out], 1) if p else out
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
    length = shape_of(x)[1]
    if counts is None:
        counts = window_counts(valid, factor, num_prefix_tokens, length)
    trailing = (1,) * (len(x.shape) - 2)
    x = ops.cast(x, dtype)
    if valid is not None:
        x = x * ops.reshape(ops.cast(valid, dtype), (-1, length, *trailing))
    sums = window_sum(x, factor, num_prefix_tokens)
    safe = ops.maximum(ops.cast(counts, dtype), 1.0)
    pooled = sums / ops.reshape(safe, (*shape_of(safe), *trailing))
    return ops.cast(pooled, out_dtype), counts


def pool_mask(mask, valid, factor, num_prefix_tokens=0):
    """Mask of the pooled keys (the rules page, "Windows").

    Query i sees window w when w holds at least one valid token and i may
    see every valid token of w.

    Args:
        mask: boolean `(B|1, N|1, T|1, S)`, every constraint merged in.
        valid: boolean `(B|1, S)`: the keys that count in a window (seen by
            some query, or cache slots still to come).

    Returns:
        `(B|1, N|1, T|1, S')` boolean.
    """
    dtype = "float32"
    valid = ops.expand_dims(ops.cast(valid, "bool"), (1, 2))
    blocked = ops.cast(ops.logical_and(valid, ops.logical_not(mask)), dtype)
    num_blocked = window_sum(blocked, factor, num_prefix_tokens, axis=3)
    num_valid = window_sum(ops.cast(valid, dtype), factor, num_prefix_tokens, 3)
    return ops.logical_and(num_valid > 0, num_blocked == 0)


def span_ends(index, factor, num_prefix_tokens=0):
    """The position of the last token of pooled key `index`'s full span
    (int tensor): `index` for a prefix token, `p + (w + 1) r - 1` for
    window w.

    The span of a window cut short by the end of the sequence still ends
    there, so a causal query inside it never sees it (the rules page,
    "Causal windows").

    Examples:
        >>> ends = span_ends(ops.arange(4), 2, 1)
        >>> ops.convert_to_numpy(ends).tolist()
        [0, 2, 4, 6]
    """
    p = num_prefix_tokens
    return ops.where(index < p, index, p + (index - p + 1) * factor - 1)


def span_of(position, factor, num_prefix_tokens=0):
    """The pooled key whose span holds `position` (int tensor): the
    inverse of `span_ends`, `position` for a prefix token, else
    `p + (position - p) // r`."""
    p = num_prefix_tokens
    rest = ops.floor_divide(ops.maximum(position - p, 0), factor)
    return ops.where(position < p, position, p + rest)


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
    per_token = ops.cast(scores, dtype) / ops.expand_dims(
        ops.maximum(counts, 1.0), (1, 2)
    )
    out = repeat_windows(per_token, factor, p, length)
    if valid is not None:
        out = out * ops.expand_dims(ops.cast(valid, dtype), (1, 2))
    return ops.cast(out, scores.dtype)


def repeat_windows(x, factor, num_prefix_tokens, length):
    """Each pooled entry of the last axis repeated over its window's keys.

    `(..., p + ceil((S - p) / r))` -> `(..., S)`: prefix entries pass
    through, window w's entry fills keys p + w r ... p + (w + 1) r - 1.
    """
    p = num_prefix_tokens
    rest = ops.repeat(x[..., p:], factor, axis=-1)[..., : length - p]
    return concatenate([x[..., :p], rest], -1) if p else rest
