"""Argument checks shared by the layers and builders.

Messages name the argument, say what was expected and end with
`Received: arg=value`, as Keras does.
"""

import math

from keras_svr_attention.functional.masks import SPARSITY


def _fail(name, expected, value):
    raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _fail(
            name,
            "a positive integer" + (" or None" if allow_none else ""),
            value,
        )
    return value


def non_negative_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail(name, "an integer >= 0", value)
    return value


def non_negative_float(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        _fail(
            name,
            "a finite number >= 0" + (" or None" if allow_none else ""),
            value,
        )
    return float(value)


def positive_float(name, value):
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        _fail(name, "a finite number > 0", value)
    return float(value)


def factors_per_head(value, num_heads):
    """None -> all ones; else one integer >= 1 per head."""
    if value is None:
        return (1,) * num_heads
    factors = tuple(value) if isinstance(value, (list, tuple)) else None
    if (
        factors is None
        or len(factors) != num_heads
        or any(
            isinstance(f, bool) or not isinstance(f, int) or f < 1
            for f in factors
        )
    ):
        raise ValueError(
            "`head_factors` must hold one integer >= 1 per head "
            f"(num_heads={num_heads}). Received: head_factors={value!r}"
        )
    return factors


def sequence_shape(name, shape):
    """Checks a `(B, length, features)` input shape."""
    if len(shape) != 3:
        raise ValueError(
            f"`{name}` must have rank 3, (batch, length, features). "
            f"Received: {name}.shape={tuple(shape)}"
        )


KERNELS = ("softmax", "linear")


def attention_options(
    num_heads,
    key_dim,
    value_dim,
    dropout,
    attention_axes,
    beta,
    learn_beta,
    epsilon,
    head_factors,
    num_prefix_tokens,
    kernel,
    sparsity,
    block_size,
    conv_kernel_size,
    conv_grid,
):
    """Checks every SVRAttention option and every pair that cannot combine.

    Returns the normalised values: beta and epsilon as floats, head_factors
    as a tuple, conv_grid as a tuple or None.
    """
    positive_int("num_heads", num_heads)
    positive_int("key_dim", key_dim)
    positive_int("value_dim", value_dim, allow_none=True)
    if attention_axes is not None:
        raise ValueError(
            "`attention_axes` must be None: SVRAttention attends over the "
            f"sequence axis. Received: attention_axes={attention_axes!r}"
        )
    if (
        isinstance(dropout, bool)
        or not isinstance(dropout, (int, float))
        or not 0 <= dropout < 1
    ):
        _fail("dropout", "a float in [0, 1)", dropout)
    beta = non_negative_float("beta", beta, allow_none=True)
    if learn_beta and beta is None:
        raise ValueError(
            "`learn_beta=True` needs `beta`, the initial value of the "
            "learned scalar. Received: learn_beta=True, beta=None"
        )
    factors = factors_per_head(head_factors, num_heads)
    non_negative_int("num_prefix_tokens", num_prefix_tokens)
    if kernel not in KERNELS:
        _fail("kernel", f"one of {KERNELS}", kernel)
    if kernel == "linear" and dropout:
        raise ValueError(
            "`dropout` on attention weights needs kernel='softmax'; linear "
            "attention never forms them. Received: kernel='linear', "
            f"dropout={dropout}"
        )
    if sparsity is not None:
        if sparsity not in SPARSITY:
            _fail("sparsity", f"None or one of {SPARSITY}", sparsity)
        positive_int("block_size", block_size)
        if kernel == "linear":
            raise ValueError(
                "`sparsity` needs kernel='softmax': a sparse pattern is an "
                "arbitrary mask, which linear attention cannot apply in "
                f"O(T). Received: sparsity={sparsity!r}, kernel='linear'"
            )
    elif block_size is not None:
        raise ValueError(
            "`block_size` is the size of a sparse pattern and needs "
            f"`sparsity`. Received: block_size={block_size!r}, "
            "sparsity=None"
        )
    positive_int("conv_kernel_size", conv_kernel_size, allow_none=True)
    if conv_grid is not None:
        if (
            conv_kernel_size is None
            or not isinstance(conv_grid, (list, tuple))
            or len(conv_grid) != 2
            or any(not isinstance(g, int) or g < 1 for g in conv_grid)
        ):
            raise ValueError(
                "`conv_grid` must be (height, width) of the patch grid, two "
                "positive integers, and needs `conv_kernel_size`. Received: "
                f"conv_grid={conv_grid!r}, "
                f"conv_kernel_size={conv_kernel_size!r}"
            )
        if any(f != 1 for f in factors):
            raise ValueError(
                "`conv_grid` needs unpooled keys: pooled windows do not "
                f"form a grid. Received: conv_grid={tuple(conv_grid)}, "
                f"head_factors={head_factors!r}"
            )
        conv_grid = tuple(conv_grid)
    return {
        "beta": beta,
        "epsilon": positive_float("epsilon", epsilon),
        "head_factors": factors,
        "conv_grid": conv_grid,
    }
