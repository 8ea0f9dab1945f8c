"""Depth-wise convolution of queries and keys (Attention-Conv1D / Conv2D).

The appendix of the paper convolves Q and K before the scores with one
kernel of size s shared by every channel:

```text
q'_t = sum_u c_u q_{t + u - s // 2}   (1-D; causal: only u <= s // 2)
q'_(y, x) = sum_(u, v) c_(u, v) q_(y + u - s // 2, x + v - s // 2)   (2-D)
```

with zero padding at the borders. Prefix tokens (CLS) pass through
unchanged. Shapes: `(B, T, N, D)` heads, as everywhere in `functional/`.
"""

from keras import ops

from keras_svr_attention.functional._tensors import concatenate
from keras_svr_attention.functional._tensors import shape_of
from keras_svr_attention.functional._tensors import zero_pad


def _shifted_sum(x, kernel, axis, size, left, taps=None):
    """sum_u kernel[u] * x shifted by (u - left) along `axis`, zero-padded.

    Only the first `taps` taps are used when given.
    """
    length = shape_of(x)[axis]
    padded = zero_pad(x, axis, left, size - 1 - left)
    out = 0.0
    for u in range(size if taps is None else taps):
        piece = _take_range(padded, u, length, axis)
        out = out + ops.cast(kernel[u], x.dtype) * piece
    return out


def _take_range(x, start, length, axis):
    index = [slice(None)] * len(x.shape)
    index[axis] = slice(start, start + length)
    return x[tuple(index)]


def conv_sequence(x, kernel, causal=False, num_prefix_tokens=0):
    """1-D depth-wise convolution over the sequence axis of `(B, T, N, D)`.

    Args:
        kernel: `(s,)`, shared by every head and channel.
        causal: bool. Drop the taps u > s // 2 that would look ahead.
    """
    size = kernel.shape[0]
    p = num_prefix_tokens
    prefix, rest = x[:, :p], x[:, p:]
    taps = size // 2 + 1 if causal else None
    out = _shifted_sum(
        rest, kernel, axis=1, size=size, left=size // 2, taps=taps
    )
    return concatenate([prefix, out], 1) if p else out


def conv_grid(x, kernel, grid_shape, num_prefix_tokens=0):
    """2-D depth-wise convolution over an image's patch grid.

    Args:
        x: `(B, p + H * W, N, D)`, patches in row-major order after `p`
            prefix tokens.
        kernel: `(s, s)`, shared by every head and channel.
        grid_shape: `(H, W)`.
    """
    p = num_prefix_tokens
    height, width = grid_shape
    shape = shape_of(x)
    if x.shape[1] is not None and x.shape[1] - p != height * width:
        raise ValueError(
            f"`conv_grid` {tuple(grid_shape)} needs {height * width} tokens "
            f"after {p} prefix tokens. Received: sequence length "
            f"{x.shape[1]}"
        )
    prefix = x[:, :p]
    grid = ops.reshape(x[:, p:], (shape[0], height, width, *shape[2:]))
    size = kernel.shape[0]
    rows = [
        _shifted_sum(grid, kernel[u], axis=2, size=size, left=size // 2)
        for u in range(size)
    ]
    out = 0.0
    for u in range(size):
        # Row u of the kernel acts on grid rows shifted by u - s // 2.
        out = out + _shift_rows(rows[u], u - size // 2)
    out = ops.reshape(out, (shape[0], height * width, *shape[2:]))
    return concatenate([prefix, out], 1) if p else out


def _shift_rows(x, offset):
    """y[:, r] = x[:, r + offset], zero outside the grid."""
    if offset == 0:
        return x
    height = x.shape[1]
    padded = zero_pad(x, 1, max(-offset, 0), max(offset, 0))
    return _take_range(padded, max(offset, 0), height, 1)
