"""Float64 NumPy versions of the paper's equations, written plainly.

Imports numpy only, never the package: an independent computation to test
the layers against. Loops are deliberate; clarity over speed.
"""

import numpy as np


def causal(num_queries, num_keys):
    """j <= i, as keras.layers.MultiHeadAttention."""
    return np.tril(np.ones((num_queries, num_keys), bool))


def windows(length, factor, num_prefix_tokens):
    """Token index lists: one per prefix token, then windows of `factor`."""
    p = num_prefix_tokens
    out = [[j] for j in range(p)]
    for start in range(p, length, factor):
        out.append(list(range(start, min(start + factor, length))))
    return out


def window_ends(length, factor, num_prefix_tokens):
    """Last position of each window's full span (a cut window included)."""
    p = num_prefix_tokens
    return list(range(p)) + [
        start + factor - 1 for start in range(p, length, factor)
    ]


def pooled_visibility(full, factor, num_prefix_tokens, causal_mask=False):
    """(B, T, W) whether query i sees pooled key w (docs/guide/rules.md,
    "Causal windows").

    `full` is the merged (B, T, S) mask without causality. A key is valid
    when some query may see it; window w is seen when it holds a valid token
    and query i may see every valid token of it, and, under `causal_mask`,
    when w's full span ends at or before i. Also returns the valid members
    of each window.
    """
    batch, num_queries, num_keys = full.shape
    wins = windows(num_keys, factor, num_prefix_tokens)
    ends = window_ends(num_keys, factor, num_prefix_tokens)
    out = np.zeros((batch, num_queries, len(wins)), bool)
    members = []
    for b in range(batch):
        valid = full[b].any(axis=0)
        members.append([[j for j in w if valid[j]] for w in wins])
        for i in range(num_queries):
            for w, m in enumerate(members[b]):
                out[b, i, w] = bool(m) and full[b, i, m].all()
                out[b, i, w] &= not causal_mask or ends[w] <= i
    return out, members


def elu1(x):
    """Phi(x) = elu(x) + 1."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def moments(keys, epsilon, standardize):
    """(mean, scale) of keys; scale sqrt(var + eps) or 1; zeros if none."""
    if len(keys) == 0:
        return 0.0, 1.0
    mu = keys.mean(0)
    scale = np.sqrt(keys.var(0) + epsilon) if standardize else 1.0
    return mu, scale


def conv1d(x, kernel, causal, prefix):
    """out_t = sum_u c_u x_{t + u - s // 2} after the prefix (causal: no
    tap past t)."""
    out = x.copy()
    size = len(kernel)
    offset = size // 2
    for t in range(prefix, len(x)):
        acc = np.zeros_like(x[t])
        for u in range(offset + 1 if causal else size):
            src = t + u - offset
            if prefix <= src < len(x):
                acc = acc + kernel[u] * x[src]
        out[t] = acc
    return out


def conv2d(x, kernel, grid, prefix):
    """2-D version over the (H, W) patch grid after the prefix tokens."""
    out = x.copy()
    height, width = grid
    size = len(kernel)
    for y in range(height):
        for z in range(width):
            acc = np.zeros_like(x[0])
            for u in range(size):
                for v in range(size):
                    yy, zz = y + u - size // 2, z + v - size // 2
                    if 0 <= yy < height and 0 <= zz < width:
                        acc = acc + kernel[u, v] * x[prefix + yy * width + zz]
            out[prefix + y * width + z] = acc
    return out


def softmax_rows(logits, visible):
    out = np.zeros_like(logits)
    if visible.any():
        z = logits[visible] - logits[visible].max()
        e = np.exp(z)
        out[visible] = e / e.sum()
    return out


def svr_attention(
    query,
    value,
    weights,
    key=None,
    mask=None,
    causal_mask=False,
    beta=0.0,
    standardize=False,
    epsilon=1e-5,
    head_factors=None,
    num_prefix_tokens=0,
    kernel="softmax",
    conv_q=None,
    conv_k=None,
    conv_grid=None,
):
    """Multi-head SVR attention, Eqns 22, 25, 26 and 51 of the paper.

    Args:
        query: (B, T, F) inputs; value, key: (B, S, F') inputs.
        weights: dict of float64 arrays wq (F, N, D), bq (N, D), wk, bk, wv
            (F', N, Dv), bv, wo (N, Dv, Fo), bo (Fo,).
        mask: (B, T, S) boolean or None. causal_mask: bool.

    Returns:
        (output (B, T, Fo), scores (B, N, T, S)).
    """
    key = value if key is None else key
    batch, num_queries, _ = query.shape
    num_keys = value.shape[1]
    num_heads, head_dim = weights["wq"].shape[1:]
    factors = head_factors or [1] * num_heads
    full = np.ones((batch, num_queries, num_keys), bool)
    if mask is not None:
        full &= np.broadcast_to(mask, full.shape)
    heads_out = np.zeros(
        (batch, num_queries, num_heads, weights["wv"].shape[2])
    )
    scores = np.zeros((batch, num_heads, num_queries, num_keys))
    for b in range(batch):
        for h in range(num_heads):
            seen, members = pooled_visibility(
                full[b : b + 1], factors[h], num_prefix_tokens, causal_mask
            )
            members = members[0]
            # Eqn 25: average the valid inputs of each window, then project.
            kx = np.array(
                [key[b, m].mean(0) if m else key[b, 0] * 0 for m in members]
            )
            vx = np.array(
                [value[b, m].mean(0) if m else value[b, 0] * 0 for m in members]
            )
            k = kx @ weights["wk"][:, h] + weights["bk"][h]
            v = vx @ weights["wv"][:, h] + weights["bv"][h]
            q = query[b] @ weights["wq"][:, h] + weights["bq"][h]
            if conv_q is not None:
                p = num_prefix_tokens
                if conv_grid is None:
                    q = conv1d(q, conv_q, causal_mask, p)
                    k = conv1d(k, conv_k, causal_mask, p)
                else:
                    q = conv2d(q, conv_q, conv_grid, p)
                    k = conv2d(k, conv_k, conv_grid, p)
            for i in range(num_queries):
                visible = seen[0, i]
                if not visible.any():
                    continue
                qi, kk = q[i], k
                if beta or standardize:
                    mu, s = moments(k[visible], epsilon, standardize)
                    qi = (qi - beta * mu) / s
                    if kernel == "linear" and causal_mask:
                        # Key w recentered over the valid keys 0..w.
                        has = np.array([bool(m) for m in members])
                        kk = np.array(
                            [
                                (k[w] - beta * mw) / sw
                                for w, (mw, sw) in enumerate(
                                    moments(
                                        k[: w + 1][has[: w + 1]],
                                        epsilon,
                                        standardize,
                                    )
                                    for w in range(len(k))
                                )
                            ]
                        )
                    else:
                        kk = (k - beta * mu) / s
                if kernel == "softmax":
                    p = softmax_rows(kk @ qi / np.sqrt(head_dim), visible)
                elif kernel == "linear":
                    sim = elu1(kk) @ elu1(qi) * visible
                    p = sim / sim.sum()
                else:
                    raise ValueError(kernel)
                heads_out[b, i, h] = p @ v
                for w, m in enumerate(members):
                    for j in m:
                        scores[b, h, i, j] = p[w] / len(m)
    out = np.einsum("btnd,nde->bte", heads_out, weights["wo"]) + weights["bo"]
    return out, scores
