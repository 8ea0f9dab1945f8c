"""The exporter workarounds: formulations chosen so that an exporter's
converter reads the graph right. Each is exact (the same numbers in eager,
jit and training) and costs at most an elementwise op or a fixed padding;
drop one when its exporter is fixed and its test still passes without it.

One lives here (`fused_scale`); the others are the tensor helpers they
shaped, named below with what they avoid. Tests: `tests/export/` (every
mode, mask kind and format Keras offers, served by the format's runtime).

Exporter (version seen): workaround, where it lives.

- torch to OpenVINO (2026.4): a one-head fused call gets no `scale`,
  `fused_scale`; `any` reduced one axis at a time,
  `visibility._plan_pooled`.
- torch.export (2.13): sizes summed from ones, `_tensors.size_tensor` and
  `positions`; one empty window at a symbolic length and windows cut from
  the whole sequence, `pooling.window_sum`; two zero chunks at a symbolic
  length, `kernels.causal_linear_attention`.
- jax2onnx (0.17): `_tensors.floor_mod` through `floor_divide`; sequence
  joins through `ops.append`, `_tensors.concatenate`; static paddings and
  strided window sums, `pooling.window_sum`; the causal mask built at
  symbolic sizes, `kernels.softmax_attention`.
- LiteRT (TensorFlow 2.21): no empty concatenation part,
  `_tensors.align_prefix`; `ops.expand_dims`, not new-axis slices
  (throughout); the chunk normaliser as a sum,
  `kernels.causal_linear_attention`.

The control for `fused_scale`:
`test_one_head_serves_on_openvino_with_its_fused_kernel`, whose
MultiHeadAttention cell fails once OpenVINO converts one head right.
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
