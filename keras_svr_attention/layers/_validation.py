"""Argument checks shared by the layers and builders.

Messages name the argument, say what was expected and end with
`Received: arg=value`, as Keras does.
"""

import math


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


def head_factors(value, num_heads):
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
