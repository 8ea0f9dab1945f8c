"""Argument checks shared by the layers and builders.

Messages name the argument, say what was expected and end with
`Received: arg=value`, as Keras does.
"""

import dataclasses
import inspect
import math
import numbers

import keras
import numpy as np

from keras_svr_attention.functional.masks import SPARSITY


def _fail(name, expected, value):
    raise ValueError(
        f"Received an invalid value for argument `{name}`, expected "
        f"{expected}. Received: {name}={value!r}"
    )


def _is_int(value):
    """Python or NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    """Python or NumPy real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def boolean(name, value):
    """A Python or NumPy bool, returned as `bool` (the string "no" is not)."""
    if not isinstance(value, (bool, np.bool_)):
        _fail(name, "a bool", value)
    return bool(value)


def positive_int(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if not _is_int(value) or value <= 0:
        _fail(
            name,
            "a positive integer" + (" or None" if allow_none else ""),
            value,
        )
    return int(value)


def non_negative_int(name, value):
    if not _is_int(value) or value < 0:
        _fail(name, "an integer >= 0", value)
    return int(value)


def non_negative_float(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if not _is_real(value) or not math.isfinite(value) or value < 0:
        _fail(
            name,
            "a finite number >= 0" + (" or None" if allow_none else ""),
            value,
        )
    return float(value)


def positive_float(name, value):
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        _fail(name, "a finite number > 0", value)
    return float(value)


def factors_per_head(value, num_heads, heads_name="num_heads"):
    """None -> all ones; else one integer >= 1 per head."""
    if value is None:
        return (1,) * num_heads
    listed = value.tolist() if hasattr(value, "tolist") else value
    factors = tuple(listed) if isinstance(listed, (list, tuple)) else None
    if (
        factors is None
        or len(factors) != num_heads
        or any(not _is_int(f) or f < 1 for f in factors)
    ):
        raise ValueError(
            "`head_factors` must hold one integer >= 1 per head "
            f"({heads_name}={num_heads}). Received: head_factors={value!r}"
        )
    return tuple(int(f) for f in factors)


def sequence_shape(name, shape):
    """Checks a `(B, length, features)` input shape."""
    if len(shape) != 3:
        raise ValueError(
            f"`{name}` must have rank 3, (batch, length, features). "
            f"Received: {name}.shape={tuple(shape)}"
        )


KERNELS = ("softmax", "linear")


def keras_supports(argument):
    """Whether this Keras's MultiHeadAttention takes `argument`."""
    signature = inspect.signature(keras.layers.MultiHeadAttention.__init__)
    return argument in signature.parameters


# The Keras release whose MultiHeadAttention added `use_gate`
# (`sliding_window` is a mask built here, on every Keras).
USE_GATE_KERAS = "3.14"


def attention_options(
    num_heads,
    key_dim,
    value_dim,
    dropout,
    attention_axes,
    flash_attention,
    sliding_window,
    use_gate,
    beta,
    standardize,
    learn_beta,
    epsilon,
    head_factors,
    num_prefix_tokens,
    kernel,
    sparsity,
    block_size,
    conv_kernel_size,
    conv_grid,
    use_keras_masks=True,
):
    """Checks every SVRAttention option and every pair that cannot combine.

    Returns `(dropout, SVROptions)`: MultiHeadAttention's dropout and the
    normalised SVR options (ints and floats as Python numbers, bools as
    `bool`, head_factors and conv_grid as tuples).
    """
    positive_int("num_heads", num_heads)
    positive_int("key_dim", key_dim)
    positive_int("value_dim", value_dim, allow_none=True)
    if attention_axes is not None:
        raise ValueError(
            "`attention_axes` must be None: SVRAttention attends over the "
            f"sequence axis. Received: attention_axes={attention_axes!r}"
        )
    if not _is_real(dropout) or not 0 <= dropout < 1:
        _fail("dropout", "a float in [0, 1)", dropout)
    dropout = float(dropout)
    use_gate = boolean("use_gate", use_gate)
    sliding_window = positive_int(
        "sliding_window", sliding_window, allow_none=True
    )
    if use_gate and not keras_supports("use_gate"):
        raise ValueError(
            f"`use_gate` needs Keras >= {USE_GATE_KERAS}; this is "
            f"Keras {keras.__version__}. Received: use_gate=True"
        )
    if flash_attention is not None:
        flash_attention = boolean("flash_attention", flash_attention)
    if flash_attention:
        if keras.config.backend() == "tensorflow":
            raise ValueError(
                "`flash_attention=True` needs a backend with a fused "
                "attention kernel (jax or torch); TensorFlow has none. "
                "Received: flash_attention=True"
            )
        if kernel == "linear":
            raise ValueError(
                "`flash_attention=True` needs kernel='softmax': there is no "
                "fused linear attention kernel. Received: "
                "flash_attention=True, kernel='linear'"
            )
        if dropout:
            raise ValueError(
                "Dropout is not supported when flash attention is enabled: "
                "`flash_attention=True` cannot apply `dropout` to attention "
                "weights it never forms. Received: flash_attention=True, "
                f"dropout={dropout}"
            )
    core = svr_core_options(
        beta, standardize, learn_beta, epsilon, head_factors, num_heads,
        num_prefix_tokens, kernel,
    )  # fmt: skip
    beta, standardize, learn_beta = core.beta, core.standardize, core.learn_beta
    factors, num_prefix_tokens = core.head_factors, core.num_prefix_tokens
    if kernel == "linear" and dropout:
        raise ValueError(
            "`dropout` on attention weights needs kernel='softmax'; linear "
            "attention never forms them. Received: kernel='linear', "
            f"dropout={dropout}"
        )
    if kernel == "linear" and sliding_window is not None:
        raise ValueError(
            "`sliding_window` needs kernel='softmax': a band mask would make "
            "linear attention quadratic. Received: "
            f"sliding_window={sliding_window}, kernel='linear'"
        )
    if sparsity is not None:
        if sparsity not in SPARSITY:
            _fail("sparsity", f"None or one of {SPARSITY}", sparsity)
        block_size = positive_int("block_size", block_size)
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
    conv_kernel_size = positive_int(
        "conv_kernel_size", conv_kernel_size, allow_none=True
    )
    if conv_grid is not None:
        if (
            conv_kernel_size is None
            or not isinstance(conv_grid, (list, tuple))
            or len(conv_grid) != 2
            or any(not _is_int(g) or g < 1 for g in conv_grid)
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
        conv_grid = tuple(int(g) for g in conv_grid)
    options = SVROptions(
        beta=beta,
        standardize=standardize,
        learn_beta=learn_beta,
        epsilon=core.epsilon,
        head_factors=factors,
        num_prefix_tokens=num_prefix_tokens,
        kernel=kernel,
        sparsity=sparsity,
        block_size=block_size,
        conv_kernel_size=conv_kernel_size,
        conv_grid=conv_grid,
        sliding_window=sliding_window,
        use_gate=use_gate,
        flash_attention=flash_attention,
        use_keras_masks=boolean("use_keras_masks", use_keras_masks),
    )
    return dropout, options


def svr_core_options(
    beta,
    standardize,
    learn_beta,
    epsilon,
    head_factors,
    num_heads,
    num_prefix_tokens,
    kernel,
    heads_name="num_heads",
):
    """Checks the options every SVR layer takes (BN, SH, the kernel) and
    returns them as `SVROptions` (the other fields at their defaults)."""
    beta = non_negative_float("beta", beta, allow_none=True)
    learn_beta = boolean("learn_beta", learn_beta)
    if learn_beta and beta is None:
        raise ValueError(
            "`learn_beta=True` needs `beta`, the initial value of the "
            "learned scalar. Received: learn_beta=True, beta=None"
        )
    if kernel not in KERNELS:
        _fail("kernel", f"one of {KERNELS}", kernel)
    return SVROptions(
        beta=beta,
        standardize=boolean("standardize", standardize),
        learn_beta=learn_beta,
        epsilon=positive_float("epsilon", epsilon),
        head_factors=factors_per_head(head_factors, num_heads, heads_name),
        num_prefix_tokens=non_negative_int(
            "num_prefix_tokens", num_prefix_tokens
        ),
        kernel=kernel,
    )


# The options of `svr_core_options`, the ones SVRGroupedQueryAttention takes.
CORE_OPTIONS = (
    "beta",
    "standardize",
    "learn_beta",
    "epsilon",
    "head_factors",
    "num_prefix_tokens",
    "kernel",
)


@dataclasses.dataclass(frozen=True)
class SVROptions:
    """The options of `SVRAttention` beyond MultiHeadAttention's own,
    checked once (`attention_options`) and serialized once (`get_config`).
    Each field is the constructor argument of the same name."""

    beta: float | None = None
    standardize: bool = False
    learn_beta: bool = False
    epsilon: float = 1e-5
    head_factors: tuple = ()
    num_prefix_tokens: int = 0
    kernel: str = "softmax"
    sparsity: str | None = None
    block_size: int | None = None
    conv_kernel_size: int | None = None
    conv_grid: tuple | None = None
    sliding_window: int | None = None
    use_gate: bool = False
    flash_attention: bool | None = None
    use_keras_masks: bool = True

    @property
    def uses_bn(self):
        """Whether queries are recentered (beta, learn_beta or standardize)."""
        return bool(self.beta) or self.learn_beta or self.standardize

    def get_config(self):
        config = dataclasses.asdict(self)
        config["head_factors"] = list(self.head_factors)
        if self.conv_grid is not None:
            config["conv_grid"] = list(self.conv_grid)
        return config
