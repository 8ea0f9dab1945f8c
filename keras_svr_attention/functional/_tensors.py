"""Tensor helpers the functional core shares: shapes that may be symbolic,
zero padding, the accumulation dtype and prefix gathers."""

import keras
from keras import ops


def shape_of(x):
    """Static sizes where known, dynamic (`ops.shape`) ones elsewhere."""
    dynamic = None
    out = []
    for i, d in enumerate(x.shape):
        if d is None:
            dynamic = ops.shape(x) if dynamic is None else dynamic
            d = dynamic[i]
        out.append(d)
    return tuple(out)


def zero_pad(x, axis, before=0, after=0):
    """`x` with `before` and `after` zeros around `axis` (Python ints).

    What `ops.pad` computes for one axis, by concatenation: `ops.pad` builds
    a Keras `Operation` on every call, which `torch.compile` cannot trace
    (a graph break inside the attention's per-group loop, and the loop's
    whole frame then runs eagerly).

    >>> tuple(zero_pad(ops.ones((2, 3, 4)), 1, 1, 2).shape)
    (2, 6, 4)
    """
    shape = shape_of(x)
    parts = [
        ops.zeros((*shape[:axis], size, *shape[axis + 1 :]), x.dtype)
        if size
        else x
        for size in (before, None, after)
        if size != 0
    ]
    return ops.concatenate(parts, axis=axis) if len(parts) > 1 else x


def accumulation_dtype(dtype):
    """float32 for float16/bfloat16/float32 inputs, float64 for float64.

    Not `keras.backend.result_type(dtype, "float32")`: on JAX that gives
    float32 for float64 inputs.
    """
    if keras.backend.standardize_dtype(dtype) == "float64":
        return "float64"
    return "float32"


def gather_prefix(prefix, lengths):
    """`prefix[:, n_i - 1]` per query, zeros where `n_i = 0`.

    Args:
        prefix: `(B, S', ...)` prefix sums over keys.
        lengths: `(B|1, T)` int visible prefix lengths n_i.
    """
    idx = ops.maximum(lengths - 1, 0)
    trailing = [1] * (len(prefix.shape) - 2)
    if lengths.shape[0] == 1:
        out = ops.take(prefix, idx[0], axis=1)
    else:
        shape = (*shape_of(idx), *trailing)
        out = ops.take_along_axis(prefix, ops.reshape(idx, shape), axis=1)
    seen = ops.reshape(lengths > 0, (*shape_of(lengths), *trailing))
    return ops.where(seen, out, ops.zeros_like(out))
