"""The options of SVR attention, checked once and carried whole.

`SVROptions` is what every layer, the functional op and the LLM hook hand
down to the planner and the kernels: one frozen record, so that a forward
never re-threads `(beta, standardize, epsilon, ...)` by hand. The checks
raise a ValueError that names the argument, says what was expected and
ends with `Received: arg=value`, as Keras does.
"""

import dataclasses
import math
import numbers

import numpy as np

KERNELS = ("softmax", "linear")
"""The SVR feature maps: exp(q^T k) and Phi(x) = elu(x) + 1."""


def fail(name, expected, value):
    """Raises the ValueError of an invalid argument."""
    raise ValueError(
        f"Received an invalid value for argument `{name}`, expected "
        f"{expected}. Received: {name}={value!r}"
    )


def repeat_factors(head_factors, num_repeats):
    """Each factor `num_repeats` times, in order: factors per key/value head
    laid over the query heads that share each one (grouped-query
    attention)."""
    return tuple(f for f in head_factors for _ in range(num_repeats))


def is_int(value):
    """Python or NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value):
    """Python or NumPy real number, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def boolean(name, value):
    """A Python or NumPy bool, returned as `bool` (the string "no" is not)."""
    if not isinstance(value, (bool, np.bool_)):
        fail(name, "a bool", value)
    return bool(value)


def positive_int(name, value, allow_none=False):
    """An integer > 0 (or None when allowed), returned as `int`."""
    if value is None and allow_none:
        return None
    if not is_int(value) or value <= 0:
        fail(name, "a positive integer" + (" or None" * allow_none), value)
    return int(value)


def non_negative_int(name, value):
    """An integer >= 0, returned as `int`."""
    if not is_int(value) or value < 0:
        fail(name, "an integer >= 0", value)
    return int(value)


def non_negative_float(name, value, allow_none=False):
    """A finite number >= 0 (or None when allowed), returned as `float`."""
    if value is None and allow_none:
        return None
    if not is_real(value) or not math.isfinite(value) or value < 0:
        expected = "a finite number >= 0" + (" or None" * allow_none)
        fail(name, expected, value)
    return float(value)


def positive_float(name, value):
    """A finite number > 0, returned as `float`."""
    if not is_real(value) or not math.isfinite(value) or value <= 0:
        fail(name, "a finite number > 0", value)
    return float(value)


def factors_per_head(value, num_heads, heads_name="num_heads"):
    """`head_factors`: None -> all ones; else one integer >= 1 per head."""
    if value is None:
        return (1,) * num_heads
    listed = value.tolist() if hasattr(value, "tolist") else value
    factors = tuple(listed) if isinstance(listed, (list, tuple)) else None
    if (
        factors is None
        or len(factors) != num_heads
        or any(not is_int(f) or f < 1 for f in factors)
    ):
        raise ValueError(
            "`head_factors` must hold one integer >= 1 per head "
            f"({heads_name}={num_heads}). Received: head_factors={value!r}"
        )
    return tuple(int(f) for f in factors)


@dataclasses.dataclass(frozen=True)
class SVROptions:
    """The options of SVR attention beyond MultiHeadAttention's own.

    Each field is the layer's constructor argument of the same name,
    normalised (Python numbers, `bool`, tuples). Build one with
    `svr_options`, which checks the fields every SVR attention takes;
    `SVRAttention` checks the rest.
    """

    beta: float | None = None
    standardize: bool = False
    learn_beta: bool = False
    epsilon: float = 1e-5
    head_factors: tuple = ()
    num_prefix_tokens: int = 0
    kernel: str = "softmax"
    chunk_size: int = 64
    sparsity: str | None = None
    block_size: int | None = None
    conv_kernel_size: int | None = None
    conv_grid: tuple | None = None
    sliding_window: int | None = None
    use_gate: bool = False
    flash_attention: bool | None = None
    logit_soft_cap: float | None = None  # the functional op's only

    @property
    def uses_bn(self):
        """Whether queries are recentered (beta, learn_beta or standardize):
        the one test of Attention-BN."""
        return bool(self.beta) or self.learn_beta or self.standardize

    def per_query_head(self, num_repeats):
        """These options with each head factor repeated `num_repeats` times:
        grouped-query attention's factors (one per key/value head) laid
        over the query heads that share each key/value head."""
        factors = repeat_factors(self.head_factors, num_repeats)
        return dataclasses.replace(self, head_factors=factors)

    def get_config(self):
        """The fields as a config dict (tuples as lists), without those only
        the functional op takes (`logit_soft_cap`)."""
        config = dataclasses.asdict(self)
        del config["logit_soft_cap"]
        config["head_factors"] = list(self.head_factors)
        if self.conv_grid is not None:
            config["conv_grid"] = list(self.conv_grid)
        return config


CORE_OPTIONS = (
    "beta",
    "standardize",
    "learn_beta",
    "epsilon",
    "head_factors",
    "num_prefix_tokens",
    "kernel",
    "chunk_size",
)
"""The options `svr_options` checks: the ones every SVR attention takes."""


def svr_options(
    num_heads,
    beta=None,
    standardize=False,
    learn_beta=False,
    epsilon=1e-5,
    head_factors=None,
    num_prefix_tokens=0,
    kernel="softmax",
    chunk_size=64,
    heads_name="num_heads",
    **fields,
):
    """Checks the options every SVR attention takes (BN, SH, the kernel)
    and returns them as `SVROptions`, with `fields` (already checked) set.

    Examples:
        >>> svr_options(2, beta=1, head_factors=[1, 2]).head_factors
        (1, 2)
    """
    beta = non_negative_float("beta", beta, allow_none=True)
    learn_beta = boolean("learn_beta", learn_beta)
    if learn_beta and beta is None:
        raise ValueError(
            "`learn_beta=True` needs `beta`, the initial value of the "
            "learned scalar. Received: learn_beta=True, beta=None"
        )
    if kernel not in KERNELS:
        fail("kernel", f"one of {KERNELS}", kernel)
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
        chunk_size=positive_int("chunk_size", chunk_size),
        **fields,
    )
