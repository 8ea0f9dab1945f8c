"""`svr_dot_product_attention`: SVR attention as a functional op.

The counterpart of `keras.ops.dot_product_attention`, for use inside any
attention layer: the same layout and arguments, plus the options of the
primal-dual framework. It is the layers' forward (the planner,
`functional.visibility`, then `functional.attention.svr_attention`), not
a copy.
"""

from keras import ops

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.functional import attention
from keras_svr_attention.functional import options as options_lib
from keras_svr_attention.functional import visibility
from keras_svr_attention.functional._tensors import shape_of


@svr_export
def svr_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    is_causal=False,
    scale=None,
    flash_attention=None,
    beta=None,
    standardize=False,
    epsilon=1e-5,
    head_factors=None,
    kernel="softmax",
    num_prefix_tokens=0,
    causal_offset=0,
    sliding_window=None,
    logit_soft_cap=None,
    sinks=None,
    key_bias=None,
):
    """Scaled dot-product attention with Attention-BN and -SH.

    ```text
    h_i = sum_j softmax_j(scale (q_i - b mu_i)^T k'_j + a'_j | m_ij) v'_j
    ```

    where:

    - query `(B, T, N, H)`, key and value `(B, S, K, H)`, K dividing N
      (grouped-query attention: query head u uses key/value head
      u // (N / K), as `keras.layers.GroupQueryAttention`);
    - `k'`, `v'` are the keys and values of key/value head g average-pooled
      by `head_factors[g]` (Eqn 25; windows of r tokens after the
      `num_prefix_tokens` prefix keys, the last one shorter), seen by the
      whole query group of g;
    - `mu_i` is the mean of the (pooled) keys query i sees, weighted by
      `beta` (Eqn 26; with `standardize`, Eqn 22);
    - `m` is `mask` and, with `is_causal`, j <= `causal_offset` + i. Under
      causality a pooled window is seen only by queries at or after the end
      of its full span, so no output depends on a later position (the
      rules page, "Causal windows"); a query that sees no key outputs
      zeros;
    - `a'` is `key_bias` (0 without it), pooled like the keys.

    Args:
        query: `(B, T, N, H)`.
        key: `(B, S, K, H)`.
        value: `(B, S, K, H)`.
        mask: boolean, broadcastable to `(B, N, T, S)` (NumPy rules, as in
            `keras.ops.dot_product_attention`), or None.
        is_causal: bool. Query i sees only keys j <= `causal_offset` + i.
        scale: float. Defaults to `1 / sqrt(H)`.
        flash_attention: passed to `keras.ops.dot_product_attention` where
            the fused kernel applies.
        beta: float, scalar tensor or None. Recentering weight (None or 0:
            off).
        standardize: bool. Also divide by the keys' standard deviation.
        epsilon: float > 0. Added to the variance under `standardize`.
        head_factors: one int >= 1 per key/value head, or None (all 1).
        kernel: "softmax" or "linear" (Phi(x) = elu(x) + 1; `mask` must then
            be a key padding mask, broadcastable to `(B, 1, 1, S)`).
        num_prefix_tokens: int. Leading keys never pooled.
        causal_offset: int or int tensor. Position of query 0 among the keys
            (cached decoding: the cache index).
        sliding_window: int or None. Query i sees only keys with
            |causal_offset + i - j| < `sliding_window` (softmax kernel).
        logit_soft_cap: float c > 0 or None. The logits become
            c tanh(logits / c) before the softmax (Gemma 2's soft-capping,
            on the SVR logits: after BN's recentering; softmax kernel).
        sinks: `(N,)` tensor or None. One logit per query head that joins
            each row's softmax denominator and takes no value (GPT-OSS's
            attention sinks); under BN the exact logits
            (q_i - b mu_i)^T (k_j - b mu_i) are kept against it (softmax
            kernel).
        key_bias: `(B|1, N, S)` tensor or None. A logit bias per query
            head and key, added after the scale (ALiBi's m_h j). Under SH a
            window's bias is the mean over its valid keys: ALiBi at the
            window's mean position (the rules page, "ALiBi"). The row term
            of BN is constant along j, so BN's logits stay exact (softmax
            kernel).

    Returns:
        `(B, T, N, H)` in the query's dtype.

    Examples:
        >>> import keras
        >>> q = keras.random.normal((2, 10, 8, 16), seed=0)
        >>> kv = keras.random.normal((2, 10, 2, 16), seed=1)
        >>> out = svr_dot_product_attention(
        ...     q, kv, kv, is_causal=True, beta=1.0, head_factors=[1, 2])
        >>> tuple(out.shape)
        (2, 10, 8, 16)
    """
    _check_heads(query, key, value)
    repeats = query.shape[2] // key.shape[2]
    learned = None if beta is None or options_lib.is_real(beta) else beta
    options = _options(
        key.shape[2], beta=beta if learned is None else 1.0,
        standardize=standardize, epsilon=epsilon, head_factors=head_factors,
        num_prefix_tokens=num_prefix_tokens, kernel=kernel,
        sliding_window=sliding_window, logit_soft_cap=logit_soft_cap,
    ).per_query_head(repeats)  # fmt: skip
    if repeats > 1:
        key = ops.repeat(key, repeats, axis=2)
        value = ops.repeat(value, repeats, axis=2)
    if mask is not None:
        mask = ops.cast(mask, "bool")
        mask = ops.reshape(mask, (1,) * (4 - len(mask.shape)) + shape_of(mask))
    plan = visibility.plan_head_groups(
        options,
        shape_of(query)[1],
        shape_of(key)[1],
        attention_mask=mask,
        causal=is_causal,
        offset=causal_offset,
    )
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    _check_extra_logits(sinks, key_bias, query.shape[2], options.kernel)
    attend = attention.kernel(
        options, learned, scale, flash_attention=flash_attention,
        sinks=sinks, key_bias=key_bias,
    )  # fmt: skip
    return attention.svr_attention(query, key, value, plan, attend)[0]


def _options(
    num_kv_heads, beta, standardize, epsilon, head_factors,
    num_prefix_tokens, kernel, sliding_window, logit_soft_cap,
):  # fmt: skip
    """The op's options, checked (a tensor `beta` arrives as 1.0: it
    recenters)."""
    options = options_lib.svr_options(
        num_kv_heads, beta=beta, standardize=standardize, epsilon=epsilon,
        head_factors=head_factors, num_prefix_tokens=num_prefix_tokens,
        kernel=kernel,
        sliding_window=options_lib.positive_int(
            "sliding_window", sliding_window, allow_none=True
        ),
        logit_soft_cap=None
        if logit_soft_cap is None
        else options_lib.positive_float("logit_soft_cap", logit_soft_cap),
    )  # fmt: skip
    for name in ("sliding_window", "logit_soft_cap"):
        if options.kernel == "linear" and getattr(options, name):
            raise ValueError(
                f"`{name}` needs kernel='softmax': the linear kernel has no "
                "logits to band or cap (a band mask would make it "
                f"quadratic). Received: {name}={getattr(options, name)}, "
                "kernel='linear'"
            )
    return options


def _check_extra_logits(sinks, key_bias, num_heads, kernel):
    """`sinks` `(N,)` and `key_bias` `(B|1, N, S)`, softmax kernel only."""
    # name, tensor, expected shape in words, rank, axis of the heads
    for name, value, shape, rank, heads_axis in (
        ("sinks", sinks, f"({num_heads},)", 1, 0),
        ("key_bias", key_bias, f"(B or 1, {num_heads}, S)", 3, 1),
    ):
        if value is None:
            continue
        if (
            kernel == "linear"
            or len(value.shape) != rank
            or value.shape[heads_axis] != num_heads
        ):
            raise ValueError(
                f"`{name}` must have shape {shape}, one entry per query "
                f"head, under kernel='softmax'. Received: {name}.shape="
                f"{tuple(value.shape)}, kernel={kernel!r}"
            )


def _check_heads(query, key, value):
    if (
        len(query.shape) != 4
        or len(key.shape) != 4
        or len(value.shape) != 4
        or query.shape[2] % key.shape[2]
        or key.shape[2] != value.shape[2]
    ):
        raise ValueError(
            "`query` must be (B, T, N, H) and `key`, `value` (B, S, K, H) "
            "with K dividing N. Received: "
            f"query.shape={tuple(query.shape)}, key.shape="
            f"{tuple(key.shape)}, value.shape={tuple(value.shape)}"
        )
