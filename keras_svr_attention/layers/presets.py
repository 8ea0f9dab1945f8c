"""Presets with the paper's names: SVRAttention with options filled in."""

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.functional.options import is_int
from keras_svr_attention.layers.svr_attention import SVRAttention


def default_head_factors(num_heads):
    """r_h = 2^(h // 2): 1, 1, 2, 2, 4, 4, 8, 8 for eight heads.

    None when `num_heads` is not an integer (Python or NumPy): the layer's
    own check then names it.
    """
    if not is_int(num_heads):
        return None
    return [2 ** (h // 2) for h in range(int(num_heads))]


@svr_export
class AttentionBN(SVRAttention):
    """Attention-BN (Eqn 26): `SVRAttention` with `beta=1.0` by default.

    ```text
    h_i = sum_j softmax_j((q_i - beta mu_i)^T (k_j - beta mu_i) / sqrt(D)) v_j
    ```

    where mu_i is the mean of the keys query i may attend to. Takes every
    argument of `SVRAttention`.

    Example:
    ```python
    layer = AttentionBN(num_heads=8, key_dim=16, beta=0.6)
    ```
    """

    def __init__(self, num_heads, key_dim, beta=1.0, **kwargs):
        super().__init__(num_heads, key_dim, beta=beta, **kwargs)


@svr_export
class AttentionSH(SVRAttention):
    """Attention-SH (Eqn 25): heads fitted on keys pooled by `head_factors`.

    `head_factors` defaults to 2^(h // 2) for head h (1, 1, 2, 2, 4, 4, 8, 8
    for eight heads). Takes every argument of `SVRAttention`.

    Example:
    ```python
    layer = AttentionSH(num_heads=4, key_dim=16, head_factors=[1, 1, 2, 4])
    ```
    """

    def __init__(self, num_heads, key_dim, head_factors=None, **kwargs):
        if head_factors is None:
            head_factors = default_head_factors(num_heads)
        super().__init__(
            num_heads, key_dim, head_factors=head_factors, **kwargs
        )


@svr_export
class AttentionBNSH(SVRAttention):
    """Attention-BN+SH (Eqn 51): pooled heads, each recentered by the mean
    of its own pooled keys. Defaults: `beta=1.0`, `head_factors` as in
    `AttentionSH`.

    Example:
    ```python
    layer = AttentionBNSH(num_heads=2, key_dim=32, head_factors=[1, 2])
    ```
    """

    def __init__(
        self, num_heads, key_dim, beta=1.0, head_factors=None, **kwargs
    ):
        if head_factors is None:
            head_factors = default_head_factors(num_heads)
        super().__init__(
            num_heads, key_dim, beta=beta, head_factors=head_factors, **kwargs
        )


@svr_export
class LinearAttention(SVRAttention):
    """Linear attention, Phi(x) = elu(x) + 1 (Katharopoulos et al. 2020).

    ```text
    h_i = Phi(q_i)^T sum_j Phi(k_j) v_j^T / Phi(q_i)^T sum_j Phi(k_j)
    ```

    `SVRAttention(kernel="linear")`; add `beta` / `head_factors` for the
    linear Attention-BN / -SH / -BN+SH of the paper (Section 4).

    Example:
    ```python
    layer = LinearAttention(num_heads=8, key_dim=16, beta=0.6)
    ```
    """

    def __init__(self, num_heads, key_dim, **kwargs):
        kwargs.setdefault("kernel", "linear")
        super().__init__(num_heads, key_dim, **kwargs)


@svr_export
class SparseAttention(SVRAttention):
    """Sparse attention: each query fits its SVR on a subset of the keys.

    `SVRAttention(sparsity=..., block_size=...)`, by default the "strided"
    pattern of Child et al. (2019) with `block_size=8`; add `beta` /
    `head_factors` for the sparse Attention-BN / -SH / -BN+SH.

    Example:
    ```python
    layer = SparseAttention(num_heads=8, key_dim=16, sparsity="fixed",
                            block_size=16)
    ```
    """

    def __init__(
        self, num_heads, key_dim, sparsity="strided", block_size=8, **kwargs
    ):
        # The same defaults as the name "sparse" (`_KERNEL_NAMES`).
        super().__init__(
            num_heads,
            key_dim,
            sparsity=sparsity,
            block_size=block_size,
            **kwargs,
        )


# Names: lowercase paper names joined by "+": a kernel ("softmax", "linear",
# "sparse") and any of "bn", "sh". The one map from names to attentions.
_KERNEL_NAMES = {
    "softmax": {},
    "linear": {"kernel": "linear"},
    "sparse": {"sparsity": "strided", "block_size": 8},
}


def _parse(attention):
    """`(kernel, extras)` of a name: "linear+bn" -> ("linear", ["bn"]),
    "bn" -> (None, ["bn"]) (no kernel named: softmax); extras may hold
    anything (checked by `options_for`)."""
    parts = str(attention).lower().replace("-", "+").split("+")
    if parts[0] in _KERNEL_NAMES:
        return parts[0], parts[1:]
    return None, parts


def available():
    """Names accepted by `get`."""
    names = []
    for kernel in _KERNEL_NAMES:
        prefix = "" if kernel == "softmax" else kernel + "+"
        names += [kernel] + [prefix + v for v in ("bn", "sh", "bn+sh")]
    return sorted(set(names) - {"softmax+bn"})


def options_for(attention, num_heads, check_only=False, **kwargs):
    """`SVRAttention` options of the attention named `attention`.

    A name is a kernel ("softmax", the default, "linear" or "sparse") joined
    by "+" with "bn" (beta, default 1.0) and/or "sh" (head_factors, default
    2^(h // 2) for `num_heads` heads). `kwargs` are further options; a
    `beta` or `head_factors` of None keeps the default. Raises `ValueError`
    for an unknown name, and for a `beta` or `head_factors` that the name
    does not use ("sh" with `beta`, "softmax" with `head_factors`).

    Examples:
        >>> options_for("bn+sh", 4)
        {'beta': 1.0, 'head_factors': [1, 1, 2, 2]}
    """
    kernel, extras = _parse(attention)
    if (
        not set(extras) <= {"bn", "sh"}
        or len(set(extras)) != len(extras)
        or (kernel == "softmax" and extras)
    ):
        raise ValueError(
            f"`attention` must be one of {available()}. Received: "
            f"attention={attention!r}"
        )
    if check_only:
        return None
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    for option, part in (("beta", "bn"), ("head_factors", "sh")):
        if option in kwargs and part not in extras:
            raise ValueError(
                f"`{option}` needs an attention name with '{part}' (it "
                f"would be ignored). Received: attention={attention!r}, "
                f"{option}={kwargs[option]!r}"
            )
    if "bn" in extras:
        kwargs.setdefault("beta", 1.0)
    if "sh" in extras:
        kwargs.setdefault("head_factors", default_head_factors(num_heads))
    return {**_KERNEL_NAMES[kernel or "softmax"], **kwargs}


def options_used_by(attention, **options):
    """`options` without the `beta` / `head_factors` that the name does not
    use: for builders that carry one value for a family of names (a `beta`
    for the BN ones, `head_factors` for the SH ones) and call `get` with
    each name. `get` itself refuses such options.

    Examples:
        >>> options_used_by("bn", beta=0.6, head_factors=[1, 2])
        {'beta': 0.6}
    """
    parts = set(_parse(attention)[1])
    unused = {"beta": "bn", "head_factors": "sh"}
    return {
        k: v
        for k, v in options.items()
        if k not in unused or unused[k] in parts
    }


def get(attention, num_heads, key_dim, **kwargs):
    """Builds the attention named `attention`, e.g. "bn+sh", "linear+bn".

    See `options_for` for the names and how `kwargs` combine with them.
    Raises `ValueError` for an unknown name.

    Examples:
        >>> get("bn+sh", num_heads=4, key_dim=8).head_factors
        (1, 1, 2, 2)
    """
    options = options_for(attention, num_heads, **kwargs)
    return SVRAttention(num_heads=num_heads, key_dim=key_dim, **options)
