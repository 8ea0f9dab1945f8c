"""Presets with the paper's names: SVRAttention with options filled in."""

from keras_svr_attention.api_export import svr_export
from keras_svr_attention.layers.svr_attention import SVRAttention


def default_head_factors(num_heads):
    """r_h = 2^(h // 2): 1, 1, 2, 2, 4, 4, 8, 8 for eight heads (SPEC 6)."""
    return [2 ** (h // 2) for h in range(num_heads)]


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
        if head_factors is None and isinstance(num_heads, int):
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
        if head_factors is None and isinstance(num_heads, int):
            head_factors = default_head_factors(num_heads)
        super().__init__(
            num_heads, key_dim, beta=beta, head_factors=head_factors, **kwargs
        )


# The one map from lowercase paper names (joined by "+") to attentions.
_NAMES = {
    "softmax": (SVRAttention, {}),
    "bn": (AttentionBN, {}),
    "sh": (AttentionSH, {}),
    "bn+sh": (AttentionBNSH, {}),
}


def available():
    """Names accepted by `get`."""
    return sorted(_NAMES)


def get(attention, num_heads, key_dim, **kwargs):
    """Builds the attention named `attention` ("softmax", "bn", "sh", ...).

    `kwargs` go to the layer; a `beta` or `head_factors` of None keeps the
    preset's default. Raises `ValueError` for an unknown name.
    """
    key = str(attention).lower().replace("-", "+").replace("_", "+")
    if key not in _NAMES:
        raise ValueError(
            f"`attention` must be one of {available()}. Received: "
            f"attention={attention!r}"
        )
    cls, defaults = _NAMES[key]
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if key == "softmax":
        kwargs.pop("head_factors", None)
        kwargs.pop("beta", None)
    elif key == "bn":
        kwargs.pop("head_factors", None)
    elif key == "sh":
        kwargs.pop("beta", None)
    return cls(num_heads=num_heads, key_dim=key_dim, **defaults, **kwargs)
