"""Formulations chosen so that an exporter's converter reads the graph
right, kept here apart from the math they rewrite. Each is exact (same
numbers in eager, jit and training), costs at most one elementwise op;
drop one when its exporter is fixed and its test still passes without it.

- `fused_scale`: a one-head fused call gets no explicit `scale`.
  Exporter: torch to OpenVINO (TorchScript frontend, seen on 2026.4).
  Tests: `tests/export/test_export.py` (`openvino-sh-*`,
  `test_one_head_serves_on_openvino_with_its_fused_kernel`, whose control
  fails once OpenVINO converts MultiHeadAttention's one head right).
"""

import math

from keras import ops


def fused_scale(query, scale):
    """`(query, scale)` for `keras.ops.dot_product_attention` on one head
    `(B, T, 1, D)`: the same logits `scale * q^T k`, with `scale` None
    (the kernel's own default 1 / sqrt(D)).

    OpenVINO's TorchScript frontend converts torch's
    `scaled_dot_product_attention` on a single head wrong when it is given
    an explicit `scale` (Keras's MultiHeadAttention with one head serves
    wrong numbers there too). So a one-head call passes no scale: at the
    default nothing changes, otherwise the query is multiplied by
    `scale * sqrt(D)` first. Groups of several heads keep `scale`, as
    MultiHeadAttention passes it.

    >>> q = ops.ones((1, 2, 1, 4))
    >>> fused_scale(q, 0.5)[1] is None
    True
    """
    if scale is None:
        return query, scale
    default = query.shape[-1] ** -0.5
    if isinstance(scale, (int, float)) and math.isclose(scale, default):
        return query, None
    return ops.multiply(query, ops.cast(scale / default, query.dtype)), None
