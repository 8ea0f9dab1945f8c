"""Key statistics of Attention-BN (Eqns 22 and 26; the rules page,
"Statistics").

mu_i and sigma_i^2 are the mean and population variance of the keys that
query i may attend to (its SVR training set), per sample and per head:

```text
mu_i      = sum_j m_ij k_j / max(sum_j m_ij, 1)
sigma_i^2 = sum_j m_ij k_j^2 / max(sum_j m_ij, 1) - mu_i^2
```

where m is the attention mask (padding, causal, sparse, pooled windows).
A row with no visible key gets mu = sigma^2 = 0. Statistics are computed in
`result_type(keys.dtype, "float32")` and returned in that dtype.
"""

from keras import ops

from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional._tensors import accumulation_dtype
from keras_svr_attention.functional._tensors import as_dtype
from keras_svr_attention.functional._tensors import shape_of


def running_moments(keys, weights=None, with_variance=False, initial=None):
    """Prefix mean (and variance) of the keys: mu_w over keys 0..w.

    Args:
        keys: `(B, S, N, D)`.
        weights: `(B|1, S)` 0/1 weights of valid keys, or None.
        with_variance: bool. Also the population variance.
        initial: the sums over earlier keys (a recurrent state's
            `shift`, `key_count`, `key_sum` and, with the variance,
            `key_square`: `(B, N, D)`, `(B, N)`), or None when these keys
            come first.

    Returns:
        `(mean, variance, sums)`: `(B, S, N, D)` in float32 (variance None
        unless asked) and the sums after the last key, the entries of
        `initial`. Where no valid key has been seen yet the moments are 0.
    """
    dtype = accumulation_dtype(keys.dtype)
    keys = as_dtype(keys, dtype)
    num_keys = shape_of(keys)[1]
    if weights is None:
        weights = ops.ones((1, num_keys), dtype)
    weights = ops.reshape(as_dtype(weights, dtype), (-1, num_keys, 1, 1))
    # Moments of k - k_0 (see key_moments); k_0 stays the first key ever.
    shift = keys[:, :1] if initial is None else initial["shift"][:, None]
    keys = keys - shift
    feats = {"key_count": weights, "key_sum": keys * weights}
    if with_variance:
        feats["key_square"] = ops.square(keys) * weights
    if isinstance(num_keys, int) and num_keys == 1:  # a decoding step
        sums = feats
    else:
        sums = {name: ops.cumsum(f, axis=1) for name, f in feats.items()}
    if initial is not None:
        sums["key_count"] = sums["key_count"] + ops.expand_dims(
            initial["key_count"], (1, 3)
        )
        for name in ("key_sum", "key_square"):
            if name in sums:
                sums[name] = sums[name] + initial[name][:, None]
    count = sums["key_count"]
    safe = ops.maximum(count, 1.0)
    mean = sums["key_sum"] / safe
    variance = None
    if with_variance:
        square = sums["key_square"] / safe
        variance = ops.maximum(square - ops.square(mean), 0.0)
    mean = ops.where(count > 0, mean + shift, 0.0)
    batch, _, heads, _ = shape_of(mean)
    totals = {name: total[:, -1] for name, total in sums.items()}
    totals["key_count"] = ops.broadcast_to(
        totals["key_count"][..., 0], (batch, heads)
    )
    totals["shift"] = shift[:, 0]
    return mean, variance, totals


def key_moments(keys, mask=None, with_variance=False):
    """Mean (and variance) of the keys each query may attend to.

    Args:
        keys: `(B, S, N, D)` projected keys.
        mask: boolean `(B|1, N|1, T|1, S)`, the finished mask of
            `visibility.plan_head_groups`, or `None`.
        with_variance: bool. Also return the population variance.

    Returns:
        `mean` of shape `(B, T, N, D)`, or `(B, 1, N, D)` when every query
        sees the same keys, and `variance` of the same shape if asked.
    """
    dtype = accumulation_dtype(keys.dtype)
    keys = ops.cast(keys, dtype)
    shape = shape_of(keys)
    shift = 0.0
    if with_variance:
        # Shifted data: moments of k - k_0 keep E[k^2] - mu^2 from
        # cancelling in float32. k_0 (the first key) is exact for any
        # shift and never depends on later tokens.
        shift = keys[:, :1]
        keys = keys - shift
    feats = [keys, ops.square(keys)] if with_variance else [keys]
    if mask is None:
        # Every key seen: plain sums, no (B, S, N, D) product with ones;
        # the count summed too, not a constant taken from the shape (that
        # an exporter would freeze at its traced length).
        count = ops.sum(ops.ones_like(keys[:1, :, :1, :1]), 1, keepdims=True)
        sums = [ops.sum(f, axis=1, keepdims=True) for f in feats]
    else:
        # No branch on the mask's query axis, 1 (padding only) or T: a
        # traced length of 1 would take the wrong one for good.
        mask_shape = shape_of(mask)
        weights = ops.broadcast_to(
            ops.cast(mask, dtype),
            (shape[0], shape[2], mask_shape[2], shape[1]),
        )
        count = ops.expand_dims(
            ops.transpose(ops.sum(weights, axis=-1), (0, 2, 1)), -1
        )
        sums = [ops.einsum("bnts,bsnd->btnd", weights, f) for f in feats]
    seen = count > 0
    count = ops.maximum(count, 1.0)
    mean = sums[0] / count
    if not with_variance:
        return mean
    variance = ops.maximum(sums[1] / count - ops.square(mean), 0.0)
    return ops.where(seen, mean + shift, 0.0), variance


def normalize(x, mean, variance, beta, epsilon):
    """(x - beta mu) [/ sqrt(sigma^2 + epsilon)], in float32 (Eqns 22, 26).

    The form needed where the shift does not cancel (the linear kernel):
    both queries and keys go through it.
    """
    dtype = accumulation_dtype(x.dtype)
    out = as_dtype(x, dtype) - ops.cast(beta, dtype) * mean
    if variance is not None:
        out = out / ops.sqrt(variance + epsilon)
    return out


def recenter_query(
    query, key, beta, options, mask=None, causal=False, with_offset=False,
    moments=None,
):  # fmt: skip
    """Attention-BN's query under the softmax kernel (Eqns 22, 26).

    Terms that do not depend on key j cancel in the softmax, so

    ```text
    softmax_j((q_i - b mu_i)^T (k_j - b mu_i) / sqrt(D))
        = softmax_j((q_i - b mu_i)^T k_j / sqrt(D))
    ```

    with mu_i (and, under `options.standardize`, sigma_i^2: each feature d
    divided by sigma_d^2 + epsilon, Eqn 22) over the keys query i may see
    (`key_moments`). Only the query changes, so a fused kernel still
    applies, causal or not. Computed in float32, returned in `query.dtype`.

    Args:
        query: `(B, T, N, D)`. key: `(B, S, N, D)`.
        beta: float or scalar tensor b.
        options: `SVROptions` (`standardize`, `epsilon`).
        mask: boolean `(B|1, N|1, T|1, S)` (finished), or None.
        causal: bool. Query i also sees only keys j <= i (the kernel's
            `is_causal`): the statistics need the mask the kernel does not.
        with_offset: bool. Also return the term that cancels,
            c_i = q'_i^T (b mu_i) `(B, T, N)` in float32: the softmax drops
            it, a softmax with attention sinks does not.
        moments: `(mean, variance or None)` of shape `(B, T, N, D)`
            computed elsewhere (a decoding state's running sums), or None;
            given, `key`, `mask` and `causal` are not read.
    """
    if moments is None:
        if causal:
            rows, cols = shape_of(query)[1], shape_of(key)[1]
            causal = masks_lib.causal_mask(rows, cols)
            mask = masks_lib.merge_masks(mask, causal[:, None])
        moments = key_moments(key, mask, with_variance=options.standardize)
        if not options.standardize:
            moments = (moments, None)
    mean, variance = moments
    dtype = accumulation_dtype(query.dtype)
    beta = ops.cast(beta, dtype)
    shifted = ops.cast(query, dtype) - beta * mean
    if variance is not None:
        shifted = shifted / (variance + options.epsilon)
    if with_offset:
        offset = ops.sum(shifted * beta * mean, axis=-1)
        return ops.cast(shifted, query.dtype), offset
    return ops.cast(shifted, query.dtype)


def recenter_linear(query, key, beta, options, key_weights=None, causal=None):
    """Attention-BN under the linear kernel: shift q and k before Phi.

    ```text
    non-causal: q_i <- (q_i - b mu) / s,     k_j <- (k_j - b mu) / s
    causal:     q_i <- (q_i - b mu_i) / s_i, k_j <- (k_j - b mu_(j)) / s_(j)
    ```

    mu over the valid keys; under causality mu_i over the keys query i sees
    and mu_(j) over the valid keys 0..j (the key's own prefix), which keeps
    the prefix sums O(T) (the rules page, "Linear kernel"). s = 1 unless
    `options.standardize`.

    Args:
        query: `(B, T, N, D)`. key: `(B, S, N, D)`.
        options: `SVROptions` (`standardize`, `epsilon`).
        key_weights: `(B|1, S)` 0/1 valid keys, or None.
        causal: `visibility.CausalPrefix`, the causal prefix lengths, or
            None (non-causal).

    Returns:
        `(query, key)` in float32 (float64 for float64 inputs).
    """
    if causal is None:
        moments = key_moments(
            key,
            None
            if key_weights is None
            else ops.expand_dims(key_weights, (1, 2)),
            with_variance=options.standardize,
        )
        key_moments_ = query_moments = (
            moments if options.standardize else (moments, None)
        )
    else:
        running = running_moments(key, key_weights, options.standardize)
        key_moments_ = running[:2]
        query_moments = tuple(
            None if m is None else causal.gather(m) for m in key_moments_
        )
    return (
        normalize(query, *query_moments, beta, options.epsilon),
        normalize(key, *key_moments_, beta, options.epsilon),
    )
