"""The checks of SVRAttention's arguments beyond those every SVR attention
takes (`functional.options.svr_options`): MultiHeadAttention's own, and
the pairs of options that cannot combine.

Messages name the argument, say what was expected and end with
`Received: arg=value`, as Keras does.
"""

import dataclasses
import inspect

import keras

from keras_svr_attention.functional import options as options_lib
from keras_svr_attention.functional.masks import SPARSITY
from keras_svr_attention.functional.options import boolean
from keras_svr_attention.functional.options import fail
from keras_svr_attention.functional.options import positive_int


def sequence_shape(name, shape):
    """Checks a `(B, length, features)` input shape."""
    if len(shape) != 3:
        raise ValueError(
            f"`{name}` must have rank 3, (batch, length, features). "
            f"Received: {name}.shape={tuple(shape)}"
        )


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
    sparsity,
    block_size,
    conv_kernel_size,
    conv_grid,
    **core,
):
    """Checks every SVRAttention option and every pair that cannot combine.

    `core` are the options of `svr_options` (beta, standardize, ...).
    Returns `(dropout, SVROptions)`: MultiHeadAttention's dropout and the
    normalised SVR options.
    """
    positive_int("num_heads", num_heads)
    positive_int("key_dim", key_dim)
    positive_int("value_dim", value_dim, allow_none=True)
    if attention_axes is not None:
        raise ValueError(
            "`attention_axes` must be None: SVRAttention attends over the "
            f"sequence axis. Received: attention_axes={attention_axes!r}"
        )
    if not options_lib.is_real(dropout) or not 0 <= dropout < 1:
        fail("dropout", "a float in [0, 1)", dropout)
    dropout = float(dropout)
    use_gate = boolean("use_gate", use_gate)
    if use_gate and not keras_supports("use_gate"):
        raise ValueError(
            f"`use_gate` needs Keras >= {USE_GATE_KERAS}; this is "
            f"Keras {keras.__version__}. Received: use_gate=True"
        )
    kernel = core.get("kernel", "softmax")
    if flash_attention is not None:
        flash_attention = boolean("flash_attention", flash_attention)
        _check_flash(flash_attention, kernel, dropout)
    sliding_window = positive_int(
        "sliding_window", sliding_window, allow_none=True
    )
    block_size = _check_kernel_pairs(
        kernel, dropout, sliding_window, sparsity, block_size
    )
    options = options_lib.svr_options(
        num_heads,
        **core,
        sparsity=sparsity,
        block_size=block_size,
        sliding_window=sliding_window,
        use_gate=use_gate,
        flash_attention=flash_attention,
    )
    conv = _check_conv(conv_kernel_size, conv_grid, options.head_factors)
    return dropout, dataclasses.replace(
        options, conv_kernel_size=conv[0], conv_grid=conv[1]
    )


def _check_flash(flash_attention, kernel, dropout):
    """`flash_attention=True` where no fused kernel can run: refused."""
    if not flash_attention:
        return
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


def _check_kernel_pairs(kernel, dropout, sliding_window, sparsity, block_size):
    """The options the linear kernel cannot take, and the sparse pattern.
    Returns the checked `block_size`."""
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
    if sparsity is None:
        if block_size is not None:
            raise ValueError(
                "`block_size` is the size of a sparse pattern and needs "
                f"`sparsity`. Received: block_size={block_size!r}, "
                "sparsity=None"
            )
        return None
    if sparsity not in SPARSITY:
        fail("sparsity", f"None or one of {SPARSITY}", sparsity)
    block_size = positive_int("block_size", block_size)
    if kernel == "linear":
        raise ValueError(
            "`sparsity` needs kernel='softmax': a sparse pattern is an "
            "arbitrary mask, which linear attention cannot apply in "
            f"O(T). Received: sparsity={sparsity!r}, kernel='linear'"
        )
    return block_size


def _check_conv(conv_kernel_size, conv_grid, head_factors):
    """Attention-Conv's kernel size and patch grid, checked."""
    conv_kernel_size = positive_int(
        "conv_kernel_size", conv_kernel_size, allow_none=True
    )
    if conv_grid is None:
        return conv_kernel_size, None
    if (
        conv_kernel_size is None
        or not isinstance(conv_grid, (list, tuple))
        or len(conv_grid) != 2
        or any(not options_lib.is_int(g) or g < 1 for g in conv_grid)
    ):
        raise ValueError(
            "`conv_grid` must be (height, width) of the patch grid, two "
            "positive integers, and needs `conv_kernel_size`. Received: "
            f"conv_grid={conv_grid!r}, "
            f"conv_kernel_size={conv_kernel_size!r}"
        )
    if any(f != 1 for f in head_factors):
        raise ValueError(
            "`conv_grid` needs unpooled keys: pooled windows do not "
            f"form a grid. Received: conv_grid={tuple(conv_grid)}, "
            f"head_factors={list(head_factors)!r}"
        )
    return conv_kernel_size, tuple(int(g) for g in conv_grid)
