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


def size_tensor(size):
    """An int32 scalar tensor holding `size`, an int or a symbolic size.

    Summed from `size` ones rather than converted: an exporter that traces
    a symbolic size (torch.export) turns a size converted to a tensor into
    the constant it held at trace time.
    """
    return ops.sum(ops.ones((size,), "int32"))


def positions(size, offset=0):
    """`(size,)` int32: offset + 0 .. size - 1, for an int or a symbolic
    size.

    `offset` (an int or int tensor) places entry 0 at `offset`: the key
    positions of queries in cached decoding. `ops.arange` at a known size,
    the running sum of ones less one at a symbolic size (JAX's `arange`
    refuses a symbolic stop when Keras passes it a step, as it always
    does).

    >>> ops.convert_to_numpy(positions(4, offset=2)).tolist()
    [2, 3, 4, 5]
    """
    if isinstance(size, int):
        out = ops.arange(size, dtype="int32")
    else:
        out = ops.cumsum(ops.ones((size,), "int32")) - 1
    if not isinstance(offset, int) or offset:
        out = out + ops.cast(offset, "int32")
    return out


def floor_mod(x, divisor):
    """`x % divisor` (floor) for an int tensor: x - floor(x / d) d.

    Through `ops.floor_divide`: jax2onnx (0.17) cannot lower `%` or `//` on
    a tensor of symbolic size.

    >>> ops.convert_to_numpy(floor_mod(ops.arange(-2, 3), 2)).tolist()
    [0, 1, 0, 1, 0]
    """
    return x - ops.floor_divide(x, divisor) * divisor


def concatenate(parts, axis):
    """`ops.concatenate(parts, axis)` along the sequence axis, joined two at
    a time by `ops.append`.

    jax2onnx (0.17) gives `jnp.concatenate`'s result the first part's size
    along a symbolic axis; `jnp.append` keeps the sum. Same result on every
    backend. Static axes (heads) keep `ops.concatenate`.
    """
    out = parts[0]
    for part in parts[1:]:
        out = ops.append(out, part, axis=axis)
    return out


def zero_pad(x, axis, before=0, after=0):
    """`x` with `before` and `after` zeros around `axis` (ints or
    symbolic sizes).

    What `ops.pad` computes for one axis, by concatenation: `ops.pad` builds
    a Keras `Operation` on every call, which `torch.compile` cannot trace
    (a graph break inside the attention's per-group loop, and the loop's
    whole frame then runs eagerly).

    >>> tuple(zero_pad(ops.ones((2, 3, 4)), 1, 1, 2).shape)
    (2, 6, 4)
    """
    shape = shape_of(x)
    for size, at_end in ((before, False), (after, True)):
        if isinstance(size, int) and size == 0:
            continue
        zeros = ops.zeros((*shape[:axis], size, *shape[axis + 1 :]), x.dtype)
        # `ops.append`, not `ops.concatenate` (see `concatenate`).
        x = ops.append(x, zeros, axis) if at_end else ops.append(zeros, x, axis)
    return x


def as_dtype(x, dtype):
    """`x` in `dtype`, with no op when it already is (each op is a
    dispatch in eager torch, where a decoding step runs)."""
    if ops.is_tensor(x) and keras.backend.standardize_dtype(x.dtype) == dtype:
        return x
    return ops.cast(x, dtype)


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


def align_prefix(prefix, factor, num_prefix_tokens, num_queries):
    """`gather_prefix` at the causal prefix lengths of queries at positions
    0..T-1, without a gather: prefix sums over pooled keys laid on the
    positions.

    Entry i is the sum over the pooled keys whose span ends at or before i
    (zeros where there is none): prefix token j from position j, window w
    from position p + (w + 1) r - 1, every key past the last one. Made of
    repeats, concatenations and slices, which every exporter keeps
    symbolic (`take_along_axis` on torch turns its axis size into a
    constant).

    Args:
        prefix: `(B, S', ...)` prefix sums over the pooled keys.
        factor: int r. num_prefix_tokens: int p.
        num_queries: T, an int or a symbolic size.
    """
    p = num_prefix_tokens
    parts = [prefix[:, :p]] if p else []  # no empty part (LiteRT)
    if factor > 1:
        before = prefix[:, p - 1 : p] if p else ops.zeros_like(prefix[:, :1])
        # One part, not r - 1: `concatenate` joins its parts one by one.
        parts.append(ops.repeat(before, factor - 1, axis=1))
        parts.append(ops.repeat(prefix[:, p:], factor, axis=1))
    else:
        parts.append(prefix[:, p:])
    last = prefix[:, -1:]
    shape = shape_of(last)
    parts.append(ops.broadcast_to(last, (shape[0], num_queries, *shape[2:])))
    return concatenate(parts, 1)[:, :num_queries]
