"""Which query sees which key: the one place where masks are merged.

Every raw input that restricts attention (query and key padding, an
`attention_mask` of rank 2, 3 or 4, causality at an offset, a sliding
window, a sparse pattern, cache slots not yet written, prefix tokens) goes
into `plan_head_groups`, which returns, per group of heads that share a
pooling factor, a finished mask over that group's (pooled) keys. The one
exception is causality at offset 0 alone, on unpooled keys: the group carries
`causal=True` and no mask, so that a fused kernel takes `is_causal`
(MultiHeadAttention's fast path), and the triangle j <= i is built only
where it is consumed without one: `kernels.softmax_attention` (at symbolic
sizes, or merged with another mask), `statistics.recenter_query`
(Attention-BN's causal moments) and the layer's call of an overridden
`_compute_attention` (MultiHeadAttention's hook takes a mask). A decoding
state's slots follow the same rule from its own record of them
(`decoding._visible`).

A finished mask keeps one rank, `(B|1, N|1, T|1, S)`, down to the kernels
and the key statistics. It changes rank once, at MultiHeadAttention's
hook: `_compute_attention` takes a mask every head shares as `(B, T, S)`
there, and `attention.softmax_group` gives it its head axis back.

The rule (the rules page, "Visibility" and "Causal windows"):

```text
m_hij   = pad_q(i) and pad_k(j) and A_hij and pattern(i, j) and band(i, j)
          [and j <= pos(i)  under causality, pos(i) = offset + i]
valid_j = some query of some head of the group sees j (the band left
          out), or j is a cache slot still to come
pooled:   i sees window w  iff  w holds a valid token,
                                i may see every valid token of w (m), and,
                                under causality, end(w) <= pos(i)
```

where `end(w) = p + (w + 1) r - 1` is the last position of w's full span
(`pooling.span_ends`), so a window cut short by the end of the sequence,
by right padding or by unwritten cache slots is seen by no query inside it:
a causal output depends on positions <= i only. An explicit lower-triangular
`attention_mask` has no positions, only the rule above it: there the last
real token sees its cut window (a documented difference).

Everything here works on symbolic shapes: `keras.ops` throughout, no
Python branch on a tensor's value or on an unknown length.
"""

from typing import NamedTuple

from keras import ops

from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional import pooling
from keras_svr_attention.functional._tensors import align_prefix
from keras_svr_attention.functional._tensors import concatenate
from keras_svr_attention.functional._tensors import floor_mod
from keras_svr_attention.functional._tensors import gather_prefix
from keras_svr_attention.functional._tensors import positions
from keras_svr_attention.functional._tensors import shape_of
from keras_svr_attention.functional._tensors import size_tensor
from keras_svr_attention.functional._tensors import zero_pad


class CausalPrefix(NamedTuple):
    """What each query sees under the linear kernel's causality: the keys
    0..n_i - 1, a prefix of the (pooled) keys.

    Attributes:
        lengths: `(1, T)` int32 prefix lengths n_i.
        factor: int r, the pooling factor of the keys.
        num_prefix_tokens: int p.
        aligned: bool. Query i stands at position i (no cache offset), so
            that prefix sums are laid on positions (`_tensors.align_prefix`)
            rather than gathered at `lengths`, and keys laid on positions
            (`lay`) for the chunked recurrence.
        chunk_size: int. Chunk of `kernels.causal_linear_attention`.
    """

    lengths: object
    factor: int = 1
    num_prefix_tokens: int = 0
    aligned: bool = False
    chunk_size: int = 64

    def lay(self, keys, num_queries):
        """The (pooled) `keys` `(B, S', ...)` laid on positions
        `(B, T, ...)`: each at the position where its span ends (prefix
        token j at j, window w at p + (w + 1) r - 1; the rules page,
        "Causal windows"), zeros elsewhere, so that query i sees the keys
        at positions <= i. Repeats and a mask, no scatter.
        """
        p, r = self.num_prefix_tokens, self.factor
        rest = keys[:, p:]
        if r > 1:
            rest = ops.repeat(rest, r, axis=1)
            ends = floor_mod(positions(shape_of(rest)[1]), r) == r - 1
            ends = ops.reshape(ends, (1, -1) + (1,) * (len(keys.shape) - 2))
            rest = ops.where(ends, rest, ops.zeros_like(rest))
        laid = concatenate([keys[:, :p], rest], 1) if p else rest
        length = shape_of(laid)[1]
        if isinstance(length, int) and isinstance(num_queries, int):
            more = max(num_queries - length, 0)
        else:  # symbolic: pad by T, then cut (no branch on sizes)
            more = num_queries
        return zero_pad(laid, 1, after=more)[:, :num_queries]

    def gather(self, prefix):
        """`prefix` `(B, S', ...)` summed over keys 0..j -> `(B, T, ...)`,
        each query's entry n_i - 1 (zeros where n_i = 0)."""
        if self.aligned:
            num_queries = shape_of(self.lengths)[1]
            return align_prefix(
                prefix, self.factor, self.num_prefix_tokens, num_queries
            )
        return gather_prefix(prefix, self.lengths)


class HeadGroup(NamedTuple):
    """The heads that share one pooling factor, and what their SVRs see.

    Attributes:
        factor: int. Pooling factor of this group's keys and values (1:
            unpooled; also 1 when only prefix tokens are left to pool).
        heads: tuple of int. The group's heads, in the layer's head order.
        num_prefix_tokens: int p. Leading keys that are never pooled (the
            rules page, "Prefix tokens").
        valid: `(B|1, S)` boolean: the unpooled keys that count in a window
            (pooled groups), or None when every key counts.
        window_counts: `(B|1, S')` float32 valid tokens per pooled key, or
            None for an unpooled group.
        mask: softmax kernel: boolean `(B|1, n|1, T|1, S')`, everything the
            group's queries may see, or None when they see every key (or,
            with `causal`, the keys j <= i).
        causal: bool. Causality at offset 0 is the only constraint left:
            `mask` is None and the kernel applies j <= i
            (`kernels.softmax_attention`, where a fused kernel takes
            `is_causal=True` without building a mask).
        key_weights: linear kernel: `(B|1, S')` 0/1 valid keys, or None.
        causal_prefix: linear kernel under causality: `CausalPrefix`, the
            keys 0..n_i - 1 that query i sees; or None.
        query_valid: linear kernel: `(B, T)` boolean unpadded queries, or
            None. The linear kernel has no per-query mask: the padded rows'
            outputs and scores are set to zero after it
            (`attention.svr_attention`), as the softmax kernel's mask gives.
    """

    factor: int
    heads: tuple
    num_prefix_tokens: int = 0
    valid: object = None
    window_counts: object = None
    mask: object = None
    causal: bool = False
    key_weights: object = None
    causal_prefix: object = None
    query_valid: object = None


def attention_mask_4d(mask, num_heads, expected):
    """`attention_mask` of rank 2, 3 or 4 -> boolean `(B|1, N|1, T|1, S)`.

    Rank 2 is `(T, S)`, rank 3 `(B, T, S)` and rank 4 `(B, N, T, S)`, one
    mask per head, as `keras.layers.MultiHeadAttention` takes them. Raises
    a ValueError naming the mask when a known size cannot broadcast.

    Args:
        expected: `(B, T, S)`, ints or None where unknown.
    """
    if mask is None:
        return None
    rank = len(mask.shape)
    full = (expected[0], num_heads, *expected[1:])
    if rank == 2:
        mask = mask[None, None]
    elif rank == 3:
        mask = ops.expand_dims(mask, 1)
    if rank not in (2, 3, 4) or not fits(mask.shape, full, 1):
        raise ValueError(
            "`attention_mask` must broadcast to (B, N, T, S) = "
            f"{full}: rank 2 (T, S), rank 3 (B, T, S) or rank 4 (B, N, T, S)"
            f" with N = num_heads. Received: attention_mask.shape="
            f"{tuple(mask.shape)}"
        )
    return ops.cast(mask, "bool")


def fits(shape, expected, broadcast=None):
    """Whether the known sizes of `shape` equal `expected`'s (or
    `broadcast`), axis by axis; None matches anything."""
    return len(shape) == len(expected) and all(
        d is None or e is None or d in (e, broadcast)
        for d, e in zip(shape, expected, strict=True)
    )


def select_heads(x, heads, num_heads, axis):
    """`x` at `heads` (Python ints, in that order) along `axis`: itself
    when that is every head in order or when it broadcasts over heads
    (size 1), else its slices of contiguous runs, concatenated.

    What `ops.take` computes, without a gather: its gradient is a scatter,
    slow on CPU and sparse on TensorFlow, and torch's ONNX exporter has no
    `ravel`, which torch's `take` uses.

    >>> tuple(select_heads(ops.ones((2, 5)), [4, 0, 1], 5, axis=1).shape)
    (2, 3)
    """
    if (
        x is None
        or list(heads) == list(range(num_heads))
        or (x.shape[axis] == 1)
    ):
        return x
    runs, start = [], 0
    for i in range(1, len(heads) + 1):
        if i == len(heads) or heads[i] != heads[i - 1] + 1:
            index = [slice(None)] * len(x.shape)
            index[axis] = slice(heads[start], heads[i - 1] + 1)
            runs.append(x[tuple(index)])
            start = i
    return runs[0] if len(runs) == 1 else ops.concatenate(runs, axis=axis)


def plan_head_groups(
    options,
    num_queries,
    num_keys,
    query_mask=None,
    key_padding=None,
    attention_mask=None,
    causal=False,
    offset=0,
    pending=None,
):
    """What each group of heads sees (the rule in the module docstring).

    Args:
        options: `SVROptions`: `head_factors` (one per head),
            `num_prefix_tokens`, `kernel`, `sliding_window`, `sparsity`
            and `block_size`.
        num_queries: T, an int or a scalar tensor.
        num_keys: S, an int or a scalar tensor.
        query_mask: `(B, T)` query padding, or None.
        key_padding: `(B, S)` key padding (value and key masks merged), or
            None.
        attention_mask: boolean `(B|1, N|1, T|1, S)` (`attention_mask_4d`), or
            None.
        causal: bool. Query i sees key j only when j <= offset + i.
        offset: int or int tensor. Position of query 0 (cached decoding).
        pending: `(B|1, S)` boolean cache slots not written yet, or None.
            They count as valid keys that no current query sees, so a
            window reaching into them is incomplete, as in the full forward.

    Returns:
        A list of `HeadGroup`, one per distinct factor. The linear kernel
        takes key padding and causality only: `attention_mask` must then
        be `(B|1, 1, 1, S)`.

    Examples:
        >>> from keras_svr_attention.functional.options import SVROptions
        >>> options = SVROptions(head_factors=(1, 2, 2, 4))
        >>> [g.factor for g in plan_head_groups(options, 6, 6)]
        [1, 2, 4]
    """
    p, factors = options.num_prefix_tokens, options.head_factors
    groups = {}  # heads by factor, in order of first appearance
    for head, factor in enumerate(factors):
        groups.setdefault(factor, []).append(head)
    groups = [(factor, tuple(heads)) for factor, heads in groups.items()]
    if isinstance(num_keys, int) and num_keys <= p:  # nothing to pool
        groups = [(1, heads) for _, heads in groups]
    if options.kernel == "linear":
        return _plan_linear(
            groups, options, num_queries, num_keys,
            query_mask=query_mask, key_padding=key_padding,
            attention_mask=attention_mask, causal=causal, offset=offset,
        )  # fmt: skip
    counted = masks_lib.merge_masks(
        None if query_mask is None else ops.expand_dims(query_mask, (1, 3)),
        None if key_padding is None else ops.expand_dims(key_padding, (1, 2)),
        attention_mask,
        _pattern(options, num_queries, num_keys, offset)
        if options.sparsity
        else None,
    )
    # A key counts in its window whatever the sliding window (the rules
    # page, "Windows"): a cached step's band then sees the windows that the
    # full forward's does.
    constraints = counted
    if options.sliding_window is not None:
        constraints = _band(options, num_queries, num_keys, offset, counted)
    at_zero = isinstance(offset, int) and offset == 0
    plan = []
    for factor, heads in groups:
        mask = select_heads(constraints, heads, len(factors), 1)
        if factor == 1 and mask is None and at_zero:
            # Only causality (or nothing): left to the kernel.
            plan.append(HeadGroup(1, heads, p, causal=causal))
        elif factor == 1:
            if causal:
                rows = masks_lib.causal_mask(num_queries, num_keys, offset)
                mask = masks_lib.merge_masks(mask, rows[:, None])
            plan.append(
                HeadGroup(1, heads, p, mask=_broadcast_last(mask, num_keys))
            )
        else:
            masks = (mask, select_heads(counted, heads, len(factors), 1))
            plan.append(_plan_pooled(
                factor, heads, p, masks=masks, shapes=(num_queries, num_keys),
                causality=(causal, offset, pending),
            ))  # fmt: skip
    return plan


def _band(options, num_queries, num_keys, offset, mask):
    """`mask` and the sliding window |pos(i) - j| < w."""
    band = masks_lib.local_window_mask(
        num_queries, num_keys, options.sliding_window, offset
    )
    return masks_lib.merge_masks(mask, band[:, None])


def _pattern(options, num_queries, num_keys, offset):
    """The sparse pattern, `(1, 1, T, S)`."""
    return masks_lib.sparse_mask(
        options.sparsity, num_queries, num_keys, options.block_size, offset
    )[:, None]


def _plan_pooled(factor, heads, p, masks, shapes, causality):
    """A pooled group: its valid keys, window counts and pooled mask.

    `masks` is `(mask, counted)`: what each query may see, and the same
    without the sliding window, whose keys count in their windows;
    `shapes` `(T, S)`; `causality` `(causal, offset, pending)`.
    """
    num_queries, num_keys = shapes
    mask, counted = masks
    causal, offset, pending = causality
    valid = pooled_mask = None
    if counted is not None:
        # One axis at a time: OpenVINO's TorchScript frontend reduced
        # `any` over two axes to the wrong rank (tests/export).
        valid = ops.any(ops.any(_broadcast_last(counted, num_keys), 2), 1)
        if pending is not None:
            valid = ops.logical_or(valid, pending)
    if mask is not None:
        if valid is None:  # only the band: every key counts
            valid = ops.ones((1, num_keys), "bool")
        mask = _broadcast_last(mask, num_keys)
        pooled_mask = pooling.pool_mask(mask, valid, factor, p)
    counts = pooling.window_counts(valid, factor, p, num_keys)
    if pooled_mask is None and not isinstance(num_keys, int):
        # The empty window at a symbolic length (`pooling.window_sum`).
        pooled_mask = ops.expand_dims(counts > 0, (1, 2))
    if causal:
        rows = positions(num_queries, offset)
        pooled = positions(pooling.pooled_length(num_keys, factor, p))
        ends = pooling.span_ends(pooled, factor, p)
        pooled_mask = masks_lib.merge_masks(
            pooled_mask, (ends[None, :] <= rows[:, None])[None, None]
        )
    return HeadGroup(
        factor, heads, p,
        valid=valid, window_counts=counts, mask=pooled_mask,
    )  # fmt: skip


def _plan_linear(
    groups, options, num_queries, num_keys, query_mask, key_padding,
    attention_mask, causal, offset,
):  # fmt: skip
    """Linear kernel: key weights, and causal prefix lengths by position."""
    p = options.num_prefix_tokens
    if attention_mask is not None:
        if attention_mask.shape[1] != 1 or attention_mask.shape[2] != 1:
            raise ValueError(
                "`attention_mask` must be a padding mask of shape (B, 1, S) "
                "under kernel='linear': linear attention supports padding "
                "and causal masks only (use `use_causal_mask=True`); an "
                "arbitrary (B, T, S) mask would make it quadratic. Received: "
                f"attention_mask.shape={tuple(attention_mask.shape)}"
            )
        key_padding = masks_lib.merge_masks(
            key_padding, attention_mask[:, 0, 0, :]
        )
    rows = positions(num_queries, offset)[None]
    at_zero = isinstance(offset, int) and offset == 0
    query_valid = None if query_mask is None else ops.cast(query_mask, "bool")
    plan = []
    for factor, heads in groups:
        counts = prefix = None
        weights = key_padding
        if factor > 1:
            counts = pooling.window_counts(key_padding, factor, p, num_keys)
            weights = counts > 0
        if causal:
            # Pooled keys whose full span ends at or before the query.
            seen = ops.minimum(rows + 1, p) + (
                ops.floor_divide(ops.maximum(rows + 1 - p, 0), factor)
            )
            total = pooling.pooled_length(num_keys, factor, p)
            lengths = ops.minimum(seen, size_tensor(total))
            prefix = CausalPrefix(
                lengths, factor, p, at_zero, options.chunk_size
            )
        plan.append(
            HeadGroup(
                factor,
                heads,
                p,
                key_padding,
                counts,
                key_weights=weights,
                causal_prefix=prefix,
                query_valid=query_valid,
            )
        )
    return plan


def _broadcast_last(mask, num_keys):
    """`(..., 1)` -> `(..., S)`; other axes keep their (maybe 1) sizes."""
    if mask is None or (mask.shape[-1] is not None and mask.shape[-1] != 1):
        return mask
    return ops.broadcast_to(mask, (*shape_of(mask)[:-1], num_keys))
