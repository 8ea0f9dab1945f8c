"""Key statistics of Attention-BN (SPEC.md section 2, Eqns 22 and 26).

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

import keras
from keras import ops

from keras_svr_attention.functional import masks as masks_lib


def accumulation_dtype(dtype):
    """float32 for float16/bfloat16/float32 inputs, float64 for float64.

    Not `keras.backend.result_type(dtype, "float32")`: on JAX that gives
    float32 for float64 inputs.
    """
    if keras.backend.standardize_dtype(dtype) == "float64":
        return "float64"
    return "float32"


def running_moments(keys, weights=None, with_variance=False):
    """Prefix mean (and variance) of the keys: mu_w over keys 0..w.

    Args:
        keys: `(B, S, N, D)`.
        weights: `(B|1, S)` 0/1 weights of valid keys, or None.

    Returns:
        `(mean, count)` or `(mean, variance, count)`: `(B, S, N, D)` in
        float32 and the running count `(B|1, S, 1, 1)`. Where no valid key
        has been seen yet the moments are 0.
    """
    dtype = accumulation_dtype(keys.dtype)
    keys = ops.cast(keys, dtype)
    num_keys = masks_lib.shape_of(keys)[1]
    if weights is None:
        weights = ops.ones((1, num_keys), dtype)
    weights = ops.reshape(ops.cast(weights, dtype), (-1, num_keys, 1, 1))
    shift = keys[:, :1] if with_variance else 0.0  # see key_moments
    keys = keys - shift
    count = ops.cumsum(weights, axis=1)
    safe = ops.maximum(count, 1.0)
    mean = ops.cumsum(keys * weights, axis=1) / safe
    if not with_variance:
        return mean, count
    square = ops.cumsum(ops.square(keys) * weights, axis=1) / safe
    variance = ops.maximum(square - ops.square(mean), 0.0)
    return ops.where(count > 0, mean + shift, 0.0), variance, count


def key_moments(keys, mask=None, with_variance=False):
    """Mean (and variance) of the keys each query may attend to.

    Args:
        keys: `(B, S, N, D)` projected keys.
        mask: boolean `(B|1, N|1, T|1, S)` or `(B|1, T|1, S)`, the
            finished mask of `visibility.plan_head_groups`, or `None`.
        with_variance: bool. Also return the population variance.

    Returns:
        `mean` of shape `(B, T, N, D)`, or `(B, 1, N, D)` when every query
        sees the same keys, and `variance` of the same shape if asked.
    """
    dtype = accumulation_dtype(keys.dtype)
    keys = ops.cast(keys, dtype)
    shape = masks_lib.shape_of(keys)
    if mask is not None and len(mask.shape) == 3:
        mask = mask[:, None]  # (B, T, S): one mask for every head
    shift = 0.0
    if with_variance:
        # Shifted data: moments of k - k_0 keep E[k^2] - mu^2 from
        # cancelling in float32. k_0 (the first key) is exact for any
        # shift and never depends on later tokens.
        shift = keys[:, :1]
        keys = keys - shift
    feats = [keys, ops.square(keys)] if with_variance else [keys]
    if mask is None:
        # Every key seen: plain sums, no (B, S, N, D) product with ones.
        count = ops.full((1, 1, 1, 1), shape[1], dtype)
        sums = [ops.sum(f, axis=1, keepdims=True) for f in feats]
    elif mask.shape[2] == 1:
        # One set of keys for every query: (B|1, N|1, 1, S) -> (B|1, S, N|1).
        weights = ops.transpose(ops.cast(mask[:, :, 0], dtype), (0, 2, 1))
        weights = weights[..., None]
        count = ops.sum(weights, axis=1, keepdims=True)
        sums = [ops.sum(f * weights, axis=1, keepdims=True) for f in feats]
    else:
        mask_shape = masks_lib.shape_of(mask)
        weights = ops.broadcast_to(
            ops.cast(mask, dtype),
            (shape[0], shape[2], mask_shape[2], shape[1]),
        )
        count = ops.transpose(ops.sum(weights, axis=-1), (0, 2, 1))[..., None]
        sums = [ops.einsum("bnts,bsnd->btnd", weights, f) for f in feats]
    seen = count > 0
    count = ops.maximum(count, 1.0)
    mean = sums[0] / count
    if not with_variance:
        return mean
    variance = ops.maximum(sums[1] / count - ops.square(mean), 0.0)
    return ops.where(seen, mean + shift, 0.0), variance


def shift_query(query, mean, beta, variance=None, epsilon=1e-5):
    """Query of Attention-BN under the softmax kernel (Eqns 22, 26).

    Terms that do not depend on key j cancel in the softmax, so

    ```text
    softmax_j((q_i - b mu_i)^T (k_j - b mu_i) / sqrt(D))
        = softmax_j((q_i - b mu_i)^T k_j / sqrt(D))
    ```

    and with `variance` (Eqn 22, standardize) each feature d is divided by
    s_d^2 = sigma_d^2 + epsilon. Only the query changes, so the fused
    `keras.ops.dot_product_attention` kernel still applies. Computed in
    float32 and returned in `query.dtype`.
    """
    dtype = accumulation_dtype(query.dtype)
    shifted = ops.cast(query, dtype) - ops.cast(beta, dtype) * mean
    if variance is not None:
        shifted = shifted / (variance + epsilon)
    return ops.cast(shifted, query.dtype)


def normalize(x, mean, beta, variance=None, epsilon=1e-5):
    """(x - beta mu) [/ sqrt(sigma^2 + epsilon)], in float32 (Eqns 22, 26).

    The form needed where the shift does not cancel (the linear kernel):
    both queries and keys go through it.
    """
    dtype = accumulation_dtype(x.dtype)
    out = ops.cast(x, dtype) - ops.cast(beta, dtype) * mean
    if variance is not None:
        out = out / ops.sqrt(variance + epsilon)
    return out


def recenter_query(
    query, key, beta, mask=None, standardize=False, epsilon=1e-5
):
    """Attention-BN's query under the softmax kernel (Eqns 22, 26).

    mu_i (and sigma_i^2 with `standardize`) over the keys query i may see
    (`key_moments`), then `shift_query`: the key-side shift cancels in the
    softmax. Returns the query in its own dtype.

    Args:
        query: `(B, T, N, D)`. key: `(B, S, N, D)`.
        beta: float or scalar tensor b.
        mask: boolean `(B|1, N|1, T|1, S)` (finished), or None.
    """
    moments = key_moments(key, mask, with_variance=standardize)
    mean, variance = moments if standardize else (moments, None)
    return shift_query(query, mean, beta, variance, epsilon)


def recenter_linear(
    query,
    key,
    beta,
    key_weights=None,
    visible=None,
    standardize=False,
    epsilon=1e-5,
):
    """Attention-BN under the linear kernel: shift q and k before Phi.

    ```text
    non-causal: q_i <- (q_i - b mu) / s,     k_j <- (k_j - b mu) / s
    causal:     q_i <- (q_i - b mu_i) / s_i, k_j <- (k_j - b mu_(j)) / s_(j)
    ```

    mu over the valid keys; under causality mu_i over the keys query i sees
    and mu_(j) over the valid keys 0..j (the key's own prefix), which keeps
    the prefix sums O(T) (SPEC.md section 6). s = 1 unless `standardize`.

    Args:
        query: `(B, T, N, D)`. key: `(B, S, N, D)`.
        key_weights: `(B|1, S)` 0/1 valid keys, or None.
        visible: `(B|1, T)` int causal prefix lengths, or None (non-causal).

    Returns:
        `(query, key)` in float32 (float64 for float64 inputs).
    """
    if visible is None:
        moments = key_moments(
            key,
            None if key_weights is None else key_weights[:, None, None, :],
            with_variance=standardize,
        )
        key_moments_ = query_moments = (
            moments if standardize else (moments, None)
        )
    else:
        running = running_moments(key, key_weights, standardize)[:-1]
        key_moments_ = tuple(running) + (None,) * (2 - len(running))
        query_moments = tuple(
            None if m is None else gather_prefix(m, visible)
            for m in key_moments_
        )
    return (
        normalize(query, query_moments[0], beta, query_moments[1], epsilon),
        normalize(key, key_moments_[0], beta, key_moments_[1], epsilon),
    )


def gather_prefix(prefix, counts):
    """`prefix[:, n_i - 1]` per query, zeros where `n_i = 0`.

    Args:
        prefix: `(B, S', ...)` prefix sums over keys.
        counts: `(B|1, T)` int visible prefix lengths.
    """
    idx = ops.maximum(counts - 1, 0)
    trailing = [1] * (len(prefix.shape) - 2)
    if counts.shape[0] == 1:
        out = ops.take(prefix, idx[0], axis=1)
    else:
        shape = (*masks_lib.shape_of(idx), *trailing)
        out = ops.take_along_axis(prefix, ops.reshape(idx, shape), axis=1)
    seen = ops.reshape(counts > 0, (*masks_lib.shape_of(counts), *trailing))
    return ops.where(seen, out, ops.zeros_like(out))
