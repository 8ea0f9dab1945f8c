"""Attention kernels: the support vector expansion evaluated at the queries.

Shape letters: B batch, T queries, S keys, N heads, D head dim.
"""

import keras
from keras import ops

from keras_svr_attention.functional import _exporters
from keras_svr_attention.functional import masks as masks_lib
from keras_svr_attention.functional._tensors import accumulation_dtype
from keras_svr_attention.functional._tensors import as_dtype
from keras_svr_attention.functional._tensors import concatenate
from keras_svr_attention.functional._tensors import positions
from keras_svr_attention.functional._tensors import shape_of
from keras_svr_attention.functional._tensors import zero_pad


def fuses(query, value, dropout=None, return_scores=False):
    """Whether `softmax_attention` takes the fused
    `keras.ops.dot_product_attention` for these heads."""
    # keras.ops.dot_product_attention needs equal query and value head dims
    # (the JAX kernel checks value against (B, S, N, D)), and JAX's computes
    # logits in float32, so float64 takes the explicit path. TensorFlow has
    # no fused kernel (its version is this same einsum math), and XLA
    # compiles its gradient for a single head as slowly as for two
    # (benchmarks/speed.py: SH training 1.4-1.8x MultiHeadAttention), so
    # TensorFlow takes the explicit path for one-head groups; groups of
    # several heads take MultiHeadAttention's own call (same program).
    # JAX and torch fuse every group (tests/layers/test_fast_paths.py).
    fused = query.shape[-1] == value.shape[-1]
    fused = fused and keras.backend.standardize_dtype(query.dtype) != "float64"
    fused = fused and (
        keras.config.backend() != "tensorflow" or query.shape[2] != 1
    )
    return fused and dropout is None and not return_scores


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
    soft_cap=None,
    sinks=None,
    bias=None,
):
    """Softmax attention, the SVR expansion with Phi(x)^T Phi(y) = exp(x^T y).

    ```text
    h_i = sum_j softmax_j(cap(scale * q_i^T k_j) + b_j  |  m_ij) v_j
    cap(x) = c tanh(x / c)    (with `soft_cap` c; else cap(x) = x)
    ```

    where b is `bias` (ALiBi's m_h j; else 0).

    With `sinks` s, each row's denominator also holds exp(s): the weights
    are exp(l_ij) / (sum_j exp(l_ij) + exp(s_i)) (GPT-OSS's attention
    sinks).

    where m is `mask` (finished by `visibility.plan_head_groups`) and,
    with `is_causal`, j <= i. This is the one place that decides the
    causal path: causality alone on a fused kernel at known sizes becomes
    its `is_causal=True` (MultiHeadAttention's causal fast path, no mask
    built); otherwise, and at symbolic sizes (an exporter's trace, where
    jax2onnx refuses `is_causal`), the causal mask is built and merged
    here. The fused `keras.ops.dot_product_attention` runs on JAX and
    torch when neither `dropout` nor the scores are needed (`fuses`);
    otherwise logits and softmax are computed in float32.

    Args:
        query: `(B, T, N, D)`.
        key: `(B, S, N, D)`.
        value: `(B, S, N, Dv)`.
        mask: boolean `(B|1, N|1, T|1, S)`, or `None`.
        is_causal: bool. Query i also sees only keys j <= i.
        scale: float. Defaults to `1 / sqrt(D)`.
        dropout: callable applied to the attention weights, or `None`.
        return_scores: bool. Also return the weights `(B, N, T, S)`.
        flash_attention: passed to `keras.ops.dot_product_attention`.
        soft_cap: float c > 0 or None. Caps the logits (Gemma 2's
            attention logit soft-capping); takes the explicit path.
        sinks: `(B|1, N|1, T|1, 1)` sink logits, or None; takes the
            explicit path.
        bias: `(B|1, N|1, T|1, S)` added to the logits, or None; takes the
            explicit path.

    Returns:
        `(output, scores)`: `(B, T, N, Dv)` in `query.dtype` and the weights
        before dropout (or `None`). A row with no visible key is exactly 0.

    >>> q = k = v = keras.ops.ones((2, 5, 3, 4))
    >>> tuple(softmax_attention(q, k, v)[0].shape)
    (2, 5, 3, 4)
    """
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    fused = fuses(query, value, dropout, return_scores)
    fused = fused and not soft_cap and sinks is None and bias is None
    known = all(isinstance(x.shape[1], int) for x in (query, key))
    if is_causal and not (fused and mask is None and known):
        causal = masks_lib.causal_mask(shape_of(query)[1], shape_of(key)[1])
        mask, is_causal = masks_lib.merge_masks(mask, causal[:, None]), False
    rows = None if mask is None else ops.any(mask, axis=-1, keepdims=True)
    if rows is not None:
        # A row that sees no key attends everywhere (finite), zeroed below.
        mask = ops.logical_or(mask, ops.logical_not(rows))
    if fused:
        if query.shape[2] == 1:  # for OpenVINO (`_exporters`)
            query, scale = _exporters.fused_scale(query, scale)
        out, scores = ops.dot_product_attention(
            query, key, value, mask=mask, scale=scale, is_causal=is_causal,
            flash_attention=flash_attention,
        ), None  # fmt: skip
    else:
        out, scores = explicit_softmax_attention(
            query, key, value, mask,
            rows=rows, scale=scale, dropout=dropout,
            return_scores=return_scores, soft_cap=soft_cap, sinks=sinks,
            bias=bias,
        )  # fmt: skip
    if rows is not None:
        rows = ops.transpose(rows, (0, 2, 1, 3))  # (B|1, T|1, N|1, 1)
        out = ops.where(rows, out, ops.zeros_like(out))
    return out, scores


def explicit_softmax_attention(
    query,
    key,
    value,
    mask,
    rows,
    scale,
    dropout=None,
    return_scores=False,
    soft_cap=None,
    sinks=None,
    bias=None,
):
    """The explicit path of `softmax_attention` (its equation), in
    float32: logits, cap, bias, mask, sinks, softmax, dropout, values.

    `mask` is finished (causality merged, blind rows opened) and `rows`
    `(B|1, N|1, T|1, 1)`, or None, marks the rows that see a key: the
    weights of the others are zeroed. Returns `(output (B, T, N, Dv) in
    query.dtype, scores or None)`.
    """
    dtype = accumulation_dtype(query.dtype)
    logits = ops.einsum(
        "btnd,bsnd->bnts", ops.cast(query, dtype), ops.cast(key, dtype)
    )
    logits = logits * ops.cast(scale, dtype)
    if soft_cap:
        logits = ops.tanh(logits / soft_cap) * soft_cap
    logits = logits if bias is None else logits + ops.cast(bias, dtype)
    if mask is not None:
        neg = -1e30 if dtype == "float32" else -1e300
        logits = ops.where(mask, logits, ops.convert_to_tensor(neg, dtype))
    if sinks is not None:  # one more logit in the row's denominator
        sinks = ops.zeros_like(logits[..., :1]) + ops.cast(sinks, dtype)
        logits = concatenate([logits, sinks], -1)
    weights = ops.softmax(logits, axis=-1)[..., : shape_of(key)[1]]
    if rows is not None:
        weights = ops.where(rows, weights, 0.0)
    scores = ops.cast(weights, query.dtype) if return_scores else None
    if dropout is not None:
        weights = ops.cast(dropout(weights), dtype)
    out = ops.einsum("bnts,bsnd->btnd", weights, ops.cast(value, dtype))
    out = ops.cast(out, query.dtype)
    return out, scores


def elu_feature_map(x):
    """Phi(x) = elu(x) + 1 (Katharopoulos et al. 2020), positive.

    Computed as exp(x) for x <= 0, with x clipped to [-30, 0] (Phi >= 9e-14),
    so that Phi never rounds to 0 in float32 and a row whose keys are all far
    below zero keeps a nonzero normaliser. The clip also keeps the branch
    that `where` does not take finite: exp of a large positive x would
    overflow and its zero-weighted gradient would be 0 * inf = NaN.

    Examples:
        >>> x = ops.array([-1e4, 0.5, 1e4])
        >>> ops.convert_to_numpy(elu_feature_map(x)).tolist()[1:]
        [1.5, 10001.0]
    """
    # exp(x) for x <= 0 rather than (exp(x) - 1) + 1, which rounds to 0.
    return ops.where(x > 0, x + 1.0, ops.exp(ops.clip(x, -30.0, 0.0)))


def linear_attention(
    query,
    key,
    value,
    key_weights=None,
    causal=None,
    return_scores=False,
):
    """Linear attention: the SVR expansion with Phi(x) = elu(x) + 1.

    ```text
    h_i = Phi(q_i)^T sum_{j in M_i} Phi(k_j) v_j^T
          / Phi(q_i)^T sum_{j in M_i} Phi(k_j)
    ```

    where M_i is every valid key (non-causal) or the first n_i keys
    (`causal`). Non-causal: Phi(Q) (Phi(K)^T V), O(T + S). Causal with
    queries at positions 0..T-1 (`causal.aligned`): the keys laid on the
    positions where they become visible (`CausalPrefix.lay`), then the
    chunked recurrence `causal_linear_attention`, O(T + (T / C) D Dv)
    memory. Causal at a cache offset: the T x S weights masked at n_i
    (decoding steps, T small). Queries and keys arrive already recentered
    (Attention-BN). Accumulates in float32.

    Args:
        query: `(B, T, N, D)`. key: `(B, S, N, D)`. value: `(B, S, N, Dv)`.
        key_weights: `(B|1, S)` 0/1 weights of valid keys, or None.
        causal: `visibility.CausalPrefix`, the prefix lengths n_i, or
            None for non-causal.
        return_scores: bool. Also return the weights `(B, N, T, S)`.

    Returns:
        `(output, scores)`: `(B, T, N, Dv)` in `value.dtype`, and the
        weights or None. A row with no visible key is exactly 0.
    """
    out_dtype = value.dtype  # q and k may arrive recentered in float32
    dtype = accumulation_dtype(value.dtype)
    phi_q = elu_feature_map(ops.cast(query, dtype))
    phi_k = elu_feature_map(ops.cast(key, dtype))
    value = ops.cast(value, dtype)
    if key_weights is not None:
        phi_k = phi_k * ops.expand_dims(ops.cast(key_weights, dtype), (2, 3))
    weights = None
    if causal is None and not return_scores:
        kv = ops.einsum("bsnd,bsne->bnde", phi_k, value)
        num = ops.einsum("btnd,bnde->btne", phi_q, kv)
        den = ops.einsum("btnd,bnd->btn", phi_q, ops.sum(phi_k, axis=1))
    elif causal is not None and causal.aligned and not return_scores:
        num_queries = shape_of(query)[1]
        laid = (causal.lay(x, num_queries) for x in (phi_k, value))
        num, den, _ = causal_linear_attention(
            phi_q, *laid, chunk_size=causal.chunk_size
        )
    else:
        weights = ops.einsum("btnd,bsnd->bnts", phi_q, phi_k)
        if causal is not None:
            cols = positions(shape_of(key)[1])
            lengths = ops.convert_to_tensor(causal.lengths)
            visible = ops.reshape(cols, (1, 1, 1, -1)) < ops.expand_dims(
                lengths, (1, 3)
            )
            weights = ops.where(visible, weights, 0.0)
        num = ops.einsum("bnts,bsne->btne", weights, value)
        den = ops.transpose(ops.sum(weights, axis=-1), (0, 2, 1))
    out = divide_rows(num, den)
    scores = None
    if return_scores:
        den = ops.transpose(ops.where(den > 0, den, 1.0), (0, 2, 1))
        scores = ops.cast(weights / ops.expand_dims(den, -1), out_dtype)
    return ops.cast(out, out_dtype), scores


def divide_rows(num, den):
    """num / den per query row `(B, T, N, Dv) / (B, T, N)`, exactly 0 where
    den = 0 (a row that sees no key).

    Each row's numerator and denominator are scaled by 1 / den, held
    constant: the quotient is unchanged, but its gradient no longer holds
    den^2, which underflows to 0 when Phi is tiny (q, k << 0): -num / den^2
    = inf, and inf times the clipped feature map's zero gradient is NaN.
    """
    seen = den > 0
    scale = ops.stop_gradient(1.0 / ops.where(seen, den, 1.0))
    num = num * ops.expand_dims(scale, -1)
    den = ops.expand_dims(ops.where(seen, den * scale, 1.0), -1)
    return ops.where(ops.expand_dims(seen, -1), num / den, 0.0)


def causal_linear_attention(phi_q, phi_k, value, state=None, chunk_size=64):
    """Causal linear attention as a recurrence, computed in chunks.

    Query i sees the state and the keys at positions j <= i:

    ```text
    S_i = S_0 + sum_{j <= i} Phi(k_j) v_j^T
    z_i = z_0 + sum_{j <= i} Phi(k_j)
    num_i = Phi(q_i)^T S_i,    den_i = Phi(q_i)^T z_i
    ```

    (Katharopoulos et al. 2020). Positions are cut into chunks of C: inside
    a chunk the C x C weights are masked to j <= i; across chunks the state
    runs (a prefix sum over T / C chunk states). Memory
    O(T C + (T / C) D Dv), never the T D Dv of a prefix sum per position.

    Args:
        phi_q: `(B, T, N, D)` Phi(q), float32.
        phi_k: `(B, T, N, D)` Phi(k) times the key's weight (0 where no key
            stands at that position).
        value: `(B, T, N, Dv)`.
        state: `(S_0 (B, N, D, Dv), z_0 (B, N, D))`, or None for zeros.
        chunk_size: int C.

    Returns:
        `(num (B, T, N, Dv), den (B, T, N), (S_T, z_T))`: the state after
        the last position.
    """
    batch, length, heads, dim = shape_of(phi_q)
    if isinstance(length, int) and length == 1 and state is not None:
        # A decoding step: S_1 = S_0 + Phi(k) v^T, no chunk to lay out.
        kv, z = (as_dtype(s, phi_q.dtype) for s in state)
        kv = kv + phi_k[:, 0, :, :, None] * value[:, 0, :, None, :]
        z = z + phi_k[:, 0]
        num = ops.einsum("bnd,bnde->bne", phi_q[:, 0], kv)[:, None]
        return num, ops.sum(phi_q * z[:, None], axis=-1), (kv, z)
    size = chunk_size
    if isinstance(length, int):
        size = max(1, min(chunk_size, length))  # no padding past a short T
    chunks = (length + size - 1) // size
    dims = {"k": dim, "v": value.shape[-1]}

    def split(x, last):  # (B, T, ...) -> (B, T / C, C, ...), zero-padded
        if isinstance(length, int):
            x = zero_pad(x, 1, after=chunks * size - length)
            return ops.reshape(x, (batch, chunks, size, heads, dims[last]))
        # Symbolic T: entry j of every chunk, a strided slice for each j
        # (no padding of a computed size, which jax2onnx cannot place),
        # and two zero chunks more, so that neither the chunk count nor
        # the count of earlier chunks is ever 1 (torch.export would fix a
        # size that is 1 at the trace, or guard against it).
        x = zero_pad(x, 1, after=3 * size - 1)
        stop = length + 2 * size
        return ops.stack([x[:, j : stop + j : size] for j in range(size)], 2)

    q, k, v = split(phi_q, "k"), split(phi_k, "k"), split(value, "v")
    inside = ops.einsum("bcind,bcjnd->bcnij", q, k)
    inside = inside * ops.tril(ops.ones((size, size), inside.dtype))
    kv = ops.cumsum(ops.einsum("bcjnd,bcjne->bcnde", k, v), axis=1)
    z = ops.cumsum(ops.sum(k, axis=2), axis=1)  # (B, C', N, D)
    # The state before each chunk: earlier chunks' sums, plus the state.
    before_kv = zero_pad(kv[:, :-1], 1, before=1)
    before_z = zero_pad(z[:, :-1], 1, before=1)
    final = (kv[:, -1], z[:, -1])
    if state is not None:
        state = [ops.cast(s, kv.dtype) for s in state]
        final = (final[0] + state[0], final[1] + state[1])
        before_kv = before_kv + state[0][:, None]
        before_z = before_z + state[1][:, None]
    num = ops.einsum("bcnij,bcjne->bcine", inside, v)
    num = num + ops.einsum("bcind,bcnde->bcine", q, before_kv)
    den = ops.transpose(ops.sum(inside, axis=-1), (0, 1, 3, 2))
    # sum_d q before_z, not an einsum: TFLite has no builtin for this one.
    den = den + ops.sum(q * ops.expand_dims(before_z, 2), axis=-1)
    num = ops.reshape(num, (batch, -1, heads, dims["v"]))
    den = ops.reshape(den, (batch, -1, heads))
    return num[:, :length], den[:, :length], final
