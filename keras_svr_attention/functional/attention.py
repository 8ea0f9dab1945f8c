"""The one forward of SVR attention, shared by every layer, the functional
op and the LLM hook.

Given the heads `(B, T, N, D)`, `(B, S, N, D)`, `(B, S, N, Dv)` and the
plan of `visibility.plan_head_groups`, `svr_attention` selects each group
of heads, average-pools its keys and values by the group's factor
(Eqn 25), attends with a kernel that carries Attention-BN (Eqns 22, 26)
and merges the groups' outputs back in head order. The kernel is chosen
once, as a callable (`kernel`, or a layer's hooks).
"""

import keras
from keras import ops

from keras_svr_attention.functional import kernels
from keras_svr_attention.functional import pooling
from keras_svr_attention.functional import statistics
from keras_svr_attention.functional import visibility
from keras_svr_attention.functional._tensors import shape_of


def svr_attention(
    query, key, value, plan, attend, return_scores=False, transform_key=None
):
    """Runs `attend` on every head group of `plan` and merges the outputs.

    Args:
        query: `(B, T, N, D)`. key: `(B, S, N, D)`. value: `(B, S, N, Dv)`.
        plan: list of `visibility.HeadGroup`.
        attend: `attend(group, query, key, value) -> (output, scores)`, on
            the group's heads and its pooled keys and values: `kernel(...)`,
            or a layer's hooks.
        return_scores: bool. Merge the scores too; a pooled window's weight
            is spread evenly over its valid tokens, so scores @ values is
            the output.
        transform_key: callable on the group's (pooled) keys, or None
            (Attention-Conv's convolution).

    Returns:
        `(output (B, T, N, Dv), scores (B, N, T, S) or None)`. A padded
        query (`HeadGroup.query_valid`) outputs exact zeros.
    """
    num_heads = query.shape[2]
    num_keys = shape_of(value)[1]
    outputs, scores, order = [], [], []
    for group in plan:
        q, k, v = (
            visibility.select_heads(x, group.heads, num_heads, 2)
            for x in (query, key, value)
        )
        pool = (group.factor, group.num_prefix_tokens, group.valid)
        if group.factor > 1:
            k, _ = pooling.pool_sequence(k, *pool, group.window_counts)
            v, _ = pooling.pool_sequence(v, *pool, group.window_counts)
        if transform_key is not None:
            k = transform_key(k)
        out, score = attend(group, q, k, v)
        if return_scores and group.factor > 1:
            score = pooling.spread_scores(
                score, *pool[:2], group.window_counts, group.valid, num_keys
            )
        if group.query_valid is not None:
            valid = group.query_valid
            out = ops.where(ops.expand_dims(valid, (2, 3)), out, 0.0)
            if score is not None:
                score = ops.where(ops.expand_dims(valid, (1, 3)), score, 0.0)
        outputs.append(out)
        scores.append(score)
        order += list(group.heads)
    # Concatenated by group; back to head order.
    inverse = [order.index(h) for h in range(len(order))]
    merged = []
    pairs = [(outputs, 2), (scores, 1)] if return_scores else [(outputs, 2)]
    for parts, axis in pairs:
        tensor = parts[0] if len(parts) == 1 else ops.concatenate(parts, axis)
        merged.append(visibility.select_heads(tensor, inverse, num_heads, axis))
    return merged[0], (merged[1] if return_scores else None)


def kernel(
    options,
    beta=None,
    scale=None,
    dropout=None,
    return_scores=False,
    flash_attention=None,
    sinks=None,
    key_bias=None,
):
    """The kernel of `options`, chosen once, with Attention-BN bound in.

    Returns `attend(group, query, key, value) -> (output, scores)` for
    `svr_attention`: `softmax_group` or `linear_group` with these
    arguments.

    Args:
        options: `SVROptions`.
        beta: b, a float or a scalar tensor (a learned weight), or None for
            `options.beta`.
        scale: float, the softmax logits' scale. Defaults to `1 / sqrt(D)`.
        dropout: callable on the attention weights, or None.
        return_scores: bool. Also return the weights.
        flash_attention: passed to `keras.ops.dot_product_attention`.
        sinks: `(N,)` attention sink logits, one per head, or None.
        key_bias: `(B|1, N, S)` logit bias per head and key (ALiBi's), or
            None; pooled with each group's keys (`group_key_bias`).
    """
    num_heads = len(options.head_factors)
    if options.kernel == "linear":
        return lambda group, q, k, v: linear_group(
            q, k, v,
            group=group, options=options, beta=beta,
            return_scores=return_scores,
        )  # fmt: skip
    return lambda group, q, k, v: softmax_group(
        q, k, v, group.mask,
        is_causal=group.causal, options=options, beta=beta, scale=scale,
        dropout=dropout, return_scores=return_scores,
        flash_attention=flash_attention,
        sinks=visibility.select_heads(sinks, group.heads, num_heads, 0),
        bias=None if key_bias is None else group_key_bias(key_bias, group),
    )  # fmt: skip


def group_key_bias(key_bias, group):
    """A head group's share of a per-key logit bias, `(B|1, N, S)` ->
    `(B|1, n, 1, S')`: its heads, average-pooled over each window's valid
    keys like the keys themselves (the rules page, "ALiBi": ALiBi's m_h j
    pools to m_h times the window's mean position)."""
    bias = visibility.select_heads(key_bias, group.heads, key_bias.shape[1], 1)
    if group.factor > 1:
        bias, _ = pooling.pool_sequence(
            ops.moveaxis(bias, 1, 2), group.factor, group.num_prefix_tokens,
            group.valid, group.window_counts,
        )  # fmt: skip
        bias = ops.moveaxis(bias, 2, 1)
    return ops.expand_dims(bias, 2)


def softmax_group(
    query,
    key,
    value,
    mask,
    is_causal,
    options,
    beta=None,
    scale=None,
    dropout=None,
    return_scores=False,
    flash_attention=None,
    sinks=None,
    bias=None,
):
    """Softmax attention of one group with Attention-BN (Eqns 22, 26).

    `mask` is the group's finished mask, `(B|1, T|1, S)` or per head
    `(B|1, n|1, T|1, S)`, or None; `is_causal` adds j <= i
    (`kernels.softmax_attention` decides how). Under `options.uses_bn`,
    query i is recentered by b mu_i, the mean of the keys it sees
    (`statistics.recenter_query`; the key-side shift cancels). Under
    `standardize`, float16 heads attend in float32 (q / sigma^2 overflows
    float16 when a query sees a single key) and the result is cast back.
    `options.logit_soft_cap` caps the logits of the recentered query.
    `sinks` `(n,)` join each row's denominator; the term of BN that cancels
    in a plain softmax, c_i = q'_i^T (b mu_i), does not cancel against a
    sink, so the row's sink logit becomes s + scale c_i (the rules page,
    "Sinks"). `bias` `(B|1, n, 1, S)` is added to the logits; the row
    term of BN is constant along it, so it still cancels.
    `beta` None means `options.beta`.
    """
    dtype = keras.backend.standardize_dtype(query.dtype)
    upcast = options.standardize and dtype == "float16"
    if upcast:
        query, key, value = (
            ops.cast(t, "float32") for t in (query, key, value)
        )
    if mask is not None and len(mask.shape) == 3:
        mask = mask[:, None]  # (B, T, S): one mask for every head
    if sinks is not None:
        sinks = ops.reshape(ops.cast(sinks, "float32"), (1, -1, 1, 1))
    if options.uses_bn:
        beta = (options.beta or 0.0) if beta is None else beta
        query = statistics.recenter_query(
            query, key,
            beta=beta, options=options, mask=mask, causal=is_causal,
            with_offset=sinks is not None,
        )  # fmt: skip
        if sinks is not None:
            query, offset = query
            scale = query.shape[-1] ** -0.5 if scale is None else scale
            offset = (
                ops.expand_dims(ops.transpose(offset, (0, 2, 1)), -1) * scale
            )
            sinks = sinks + offset
    out, scores = kernels.softmax_attention(
        query, key, value, mask, is_causal,
        scale=scale, dropout=dropout, return_scores=return_scores,
        flash_attention=flash_attention, soft_cap=options.logit_soft_cap,
        sinks=sinks, bias=bias,
    )  # fmt: skip
    if upcast:
        out = ops.cast(out, dtype)
        scores = None if scores is None else ops.cast(scores, dtype)
    return out, scores


def linear_group(
    query, key, value, group, options, beta=None, return_scores=False
):
    """Linear attention of one group with Attention-BN: under
    `options.uses_bn`, q and k shifted before Phi
    (`statistics.recenter_linear`), then `kernels.linear_attention` over
    the group's key weights and causal prefix lengths. `beta` None means
    `options.beta`."""
    if options.uses_bn:
        beta = (options.beta or 0.0) if beta is None else beta
        query, key = statistics.recenter_linear(
            query, key,
            beta=beta, options=options, key_weights=group.key_weights,
            causal=group.causal_prefix,
        )  # fmt: skip
    return kernels.linear_attention(
        query,
        key,
        value,
        key_weights=group.key_weights,
        causal=group.causal_prefix,
        return_scores=return_scores,
    )
