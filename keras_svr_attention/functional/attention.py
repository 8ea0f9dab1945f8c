"""SVR attention over planned head groups: the computation every layer and
the functional op share.

Given the heads `(B, T, N, D)`, `(B, S, N, D)`, `(B, S, N, Dv)` and the
plan of `visibility.plan_head_groups`, each group of heads is selected,
its keys and values average-pooled by the group's factor (Eqn 25), and
attended to by a kernel with Attention-BN (Eqns 22, 26); the groups'
outputs are merged back in head order.
"""

import keras
from keras import ops

from keras_svr_attention.functional import kernels
from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional import pooling
from keras_svr_attention.functional import statistics
from keras_svr_attention.functional import visibility


def attend_groups(
    query,
    key,
    value,
    plan,
    attend,
    num_prefix_tokens=0,
    return_scores=False,
    transform_key=None,
):
    """Runs `attend` on every head group of `plan` and merges the outputs.

    Args:
        query: `(B, T, N, D)`. key: `(B, S, N, D)`. value: `(B, S, N, Dv)`.
        plan: list of `visibility.HeadGroup`.
        attend: `attend(group, query, key, value) -> (output, scores)`, on
            the group's heads and its pooled keys and values: the kernel
            (a layer passes its hooks).
        num_prefix_tokens: int p. Leading keys that are never pooled.
        return_scores: bool. Merge the scores too; a pooled window's weight
            is spread evenly over its valid tokens, so scores @ values is
            the output.
        transform_key: callable on the group's (pooled) keys, or None
            (Attention-Conv's convolution).

    Returns:
        `(output (B, T, N, Dv), scores (B, N, T, S) or None)`.
    """
    num_heads = query.shape[2]
    num_keys = masks_lib.shape_of(value)[1]
    outputs, scores, order = [], [], []
    for group in plan:
        heads = group.heads
        q, k, v = (
            visibility.select_heads(x, heads, num_heads, 2)
            for x in (query, key, value)
        )
        if group.factor > 1:
            pool = (group.factor, num_prefix_tokens, group.valid, group.counts)
            k, _ = pooling.pool_sequence(k, *pool)
            v, _ = pooling.pool_sequence(v, *pool)
        if transform_key is not None:
            k = transform_key(k)
        out, score = attend(group, q, k, v)
        if return_scores and group.factor > 1:
            score = pooling.spread_scores(
                score,
                group.factor,
                num_prefix_tokens,
                group.counts,
                group.valid,
                num_keys,
            )
        if group.query_valid is not None:
            out, score = _zero_padded_queries(out, score, group.query_valid)
        outputs.append(out)
        scores.append(score)
        order += list(heads)
    output = _merge(outputs, order, axis=2)
    return output, _merge(scores, order, axis=1) if return_scores else None


def _zero_padded_queries(output, scores, query_valid):
    """Exact zeros for padded queries: output `(B, T, n, Dv)`, scores
    `(B, n, T, S)` or None, `query_valid` `(B, T)`."""
    output = ops.where(query_valid[:, :, None, None], output, 0.0)
    if scores is not None:
        scores = ops.where(query_valid[:, None, :, None], scores, 0.0)
    return output, scores


def _merge(tensors, order, axis):
    merged = tensors[0] if len(tensors) == 1 else ops.concatenate(tensors, axis)
    if order != sorted(order):
        inverse = [order.index(h) for h in range(len(order))]
        merged = ops.take(merged, inverse, axis=axis)
    return merged


def softmax_group(
    query,
    key,
    value,
    mask=None,
    causal_only=False,
    beta=0.0,
    standardize=False,
    epsilon=1e-5,
    scale=None,
    dropout=None,
    return_scores=False,
    flash_attention=None,
):
    """Softmax attention of one group with Attention-BN (Eqns 22, 26).

    `mask` is the group's finished mask; `causal_only` (with no mask) means
    j <= i, taken by a fused kernel as `is_causal=True` and built here
    otherwise (`visibility.with_causal_mask`). mu_i is taken over the keys
    query i sees; only the query shifts (the key-side shift cancels). Under
    `standardize`, float16 heads attend in float32 (q / sigma^2 overflows
    float16 when a query sees a single key) and the result is cast back.
    """
    dtype = keras.backend.standardize_dtype(query.dtype)
    upcast = standardize and dtype == "float16"
    if upcast:
        query, key, value = (
            ops.cast(t, "float32") for t in (query, key, value)
        )
    uses_bn = _uses_bn(beta, standardize)
    if causal_only and (
        uses_bn or not kernels.fuses(query, value, dropout, return_scores)
    ):
        mask, causal_only = visibility.with_causal_mask(mask, query, key), False
    if uses_bn:
        query = statistics.recenter_query(
            query, key, beta, mask, standardize, epsilon
        )
    out, scores = kernels.softmax_attention(
        query,
        key,
        value,
        mask=mask,
        is_causal=causal_only,
        scale=scale,
        dropout=dropout,
        return_scores=return_scores,
        flash_attention=flash_attention,
    )
    if upcast:
        out = ops.cast(out, dtype)
        scores = None if scores is None else ops.cast(scores, dtype)
    return out, scores


def linear_group(
    query,
    key,
    value,
    key_weights=None,
    visible=None,
    beta=0.0,
    standardize=False,
    epsilon=1e-5,
    return_scores=False,
):
    """Linear attention of one group with Attention-BN: q and k shifted
    before Phi (`statistics.recenter_linear`), then
    `kernels.linear_attention`."""
    if _uses_bn(beta, standardize):
        query, key = statistics.recenter_linear(
            query, key, beta, key_weights, visible, standardize, epsilon
        )
    return kernels.linear_attention(
        query,
        key,
        value,
        key_weights=key_weights,
        counts=visible,
        return_scores=return_scores,
    )


def _uses_bn(beta, standardize):
    """A tensor beta (learned) always recenters; a number when nonzero."""
    return standardize or not isinstance(beta, float | int) or bool(beta)
