"""Test helpers: the shared sizes, modes and inputs of the layer tests, the
NumPy reference with a layer's weights, tolerances, backend-specific
gradients and layer weights.

Sizes are pairwise distinct (B=2, T=7, S=9, N=4, D=3, features 6/5/8) so
that a swapped axis fails loudly; T and S are not divisible by the factors.
"""

import keras
import numpy as np
import pytest

import keras_svr_attention as ksa
from tests import numpy_reference as ref

BACKEND = keras.config.backend()

# Eager JAX compiles every op for every new shape: tests that sweep many
# shapes or finite differences run on JAX in `nox -s slow` only (on the
# other backends in the default matrix too).
slow_on_jax = pytest.mark.slow if BACKEND == "jax" else pytest.mark.fast

# A case that repeats, for one more family or option, Python-level logic
# (what a KerasHub family converts to, how its cache is laid out) whose
# backend ops the kept cases already run on each backend: the torch session
# (the fastest) runs every such case, TensorFlow and JAX in `nox -s slow`.
slow_off_torch = pytest.mark.slow if BACKEND != "torch" else pytest.mark.fast


def covering_off_torch(modes, covering, ids=None):
    """`modes` as parameters (a tuple: one value per argument), those
    outside `covering` marked `slow_off_torch`: `covering` reaches what the
    others reach (each caller's comment says what was measured and any
    branch it misses), so TensorFlow and JAX run the others in `nox -s
    slow` only.

    Where a comment says "covering (suite)", it was measured this way:
    coverage.py with branches on torch over the whole default suite, one
    context per test (`pytest --cov=keras_svr_attention --cov-branch
    --cov-context=test`); the rows left to TensorFlow and JAX, with the
    rest of their suite, reach every line and branch arc of the library
    that the suite reaches there with every row.
    """
    params = []
    for i, m in enumerate(modes):
        values = m if isinstance(m, tuple) else (m,)
        marks = () if m in covering else slow_off_torch
        params.append(pytest.param(*values, marks=marks, id=ids and ids[i]))
    return params


# The tests that fit with `jit_compile=True`: on torch, the default run
# traces them with dynamo on `aot_eager` (tests/conftest.py) and `nox -s
# slow` runs them again on inductor, selected by this mark.
compiles_the_train_step = pytest.mark.compiles_the_train_step

# Tests of what no backend computes (the scripts' option checks in a
# subprocess, the offline suite's report from its committed runs): the torch
# session runs them, the other two skip them.
backend_independent = pytest.mark.skipif(
    BACKEND != "torch", reason="backend-independent: run by the torch session"
)


def assert_allclose(actual, desired, atol=1e-5, rtol=1e-5, err_msg=""):
    """`|actual - desired| <= atol * scale + rtol * |desired|`, with
    `scale` the largest `|desired|` (at least 1).

    float32 promises a relative error per operation, so the error of an
    entry near zero follows the magnitude of the values it was summed from,
    not its own: an absolute tolerance fixed for unit-scale values fails on
    outputs of 20 (two residual layers) on a CPU that sums in another
    order. `atol=0` stays exact.
    """
    desired = np.asarray(keras.ops.convert_to_numpy(desired), dtype="float64")
    scale = max(1.0, float(np.max(np.abs(desired), initial=0.0)))
    np.testing.assert_allclose(
        np.asarray(keras.ops.convert_to_numpy(actual), dtype="float64"),
        desired,
        atol=atol * scale,
        rtol=rtol,
        err_msg=err_msg,
    )


def attention_weights(layer):
    """The four projections of a built layer as float64 NumPy arrays."""

    def arr(v):
        return np.asarray(keras.ops.convert_to_numpy(v), "float64")

    dense = {
        "q": layer.query_dense,
        "k": layer.key_dense,
        "v": layer.value_dense,
        "o": layer.output_dense,
    }
    out = {}
    for name, d in dense.items():
        kernel = arr(d.kernel)
        bias_shape = kernel.shape[-1:] if name == "o" else kernel.shape[1:]
        out["w" + name] = kernel
        out["b" + name] = (
            np.zeros(bias_shape) if d.bias is None else arr(d.bias)
        )
    return out


def value_and_grad(fn, x):
    """(fn(x), d fn / d x) for a scalar-valued `fn`, on the active backend."""
    if BACKEND == "jax":
        import jax

        return jax.value_and_grad(fn)(keras.ops.convert_to_tensor(x))
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.convert_to_tensor(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return y, tape.gradient(y, x)
    if BACKEND == "torch":
        import torch

        x = torch.tensor(np.asarray(x), requires_grad=True)
        y = fn(x)
        y.backward()
        return y.detach(), x.grad
    raise NotImplementedError(BACKEND)


def random_weights(layer, seed=0):
    """Gives every weight (biases too) random values, so that no term is 0."""
    rng = np.random.default_rng(seed)
    layer.set_weights(
        [
            rng.normal(size=w.shape).astype(w.dtype) * 0.5
            for w in layer.get_weights()
        ]
    )


B, T, S, N, D = 2, 7, 9, 4, 3
MODES = {
    "softmax": {},
    "bn": {"beta": 0.8},
    "bn-std": {"beta": 0.6, "standardize": True},
    "sh": {"head_factors": [1, 2, 3, 2]},
    "bn+sh": {"beta": 1.0, "head_factors": [2, 1, 1, 4]},
    "bn-std+sh": {
        "beta": 1.2,
        "standardize": True,
        "head_factors": [1, 1, 2, 4],
    },
}

# What users build (the model battery, the exports): one mode per branch of
# the forward. SH's group of factor 1 is plain softmax attention and BN+SH's
# is Attention-BN (two heads: the fused kernel); linear BN+SH's is the
# linear kernel with BN. So softmax, BN and linear alone take no branch of
# their own here. "gqa" modes are SVRGroupedQueryAttention (`svr_layer`).
MODEL_MODES = {
    "sh": {"head_factors": [1, 2, 3, 2]},
    "bn+sh": {"beta": 1.0, "head_factors": [2, 1, 1, 4]},
    # Chunks of 4: the causal recurrence runs over several chunks.
    "linear+bn+sh": {
        "kernel": "linear",
        "beta": 1.0,
        "head_factors": [1, 2],
        "chunk_size": 4,
    },
    "sparse": {"sparsity": "strided", "block_size": 3},
    "conv": {"conv_kernel_size": 3, "beta": 0.5},
    "gqa+bn+sh": {"beta": 1.0, "head_factors": [2, 1, 1, 4]},
    "gqa+linear+sh": {"kernel": "linear", "head_factors": [1, 1, 3, 3]},
    # A CLS token: never pooled, seen by every query.
    "bn+sh+cls": {
        "beta": 1.0,
        "head_factors": [2, 1, 1, 4],
        "num_prefix_tokens": 1,
    },
}

# The modes of MODEL_MODES that reach between them every line of the
# forward the others reach, and every exporter workaround
# (functional/_exporters.py): pooled windows with BN and a prefix token, the
# chunked causal linear recurrence, the grouped layer, the sparse and the
# conv kernels. Measured with coverage.py on torch's model battery: the
# same 1854 lines as the eight modes, and all branches but one, the linear
# kernel without BN (GQA linear SH; the layer tests run it on every
# backend). SH alone, BN+SH without a prefix token and GQA linear SH repeat
# those: the model battery runs them on torch and, with the export grid's
# cells, in `nox -s slow`.
COVERING_MODES = ("bn+sh+cls", "linear+bn+sh", "gqa+bn+sh", "sparse", "conv")


def model_layer(mode, **kwargs):
    """The attention of `MODEL_MODES[mode]`: SVRGroupedQueryAttention for
    the "gqa" modes, else SVRAttention."""
    kind = "gqa" if mode.startswith("gqa") else "svr"
    return svr_layer(kind, MODEL_MODES[mode], **kwargs)


# Decoding from a state (tests/layers/test_*_state.py): a sequence of
# DECODING_LENGTH fed in pieces ending at these positions. Single tokens
# over the prefix, the left padding and the first windows, then pieces
# across the right padding; a prefill, then single tokens to the end.
DECODING_LENGTH = 19
DECODING_SPLITS = {
    "tokens-then-pieces": [1, 2, 3, 4, 5, 6, 7, 13],
    "prefill-then-tokens": list(range(11, DECODING_LENGTH)),
}


def svr_layer(kind, options, **kwargs):
    """`SVRAttention` (its heads of key_dim 3) or, for kind "gqa",
    `SVRGroupedQueryAttention` with as many query heads and half as many
    key/value heads, each taking every other head factor of `options`."""
    options = {**options, **kwargs}
    heads = len(options.get("head_factors", [0] * N))
    if kind == "svr":
        return ksa.SVRAttention(num_heads=heads, key_dim=3, **options)
    if "head_factors" in options:
        options["head_factors"] = options["head_factors"][::2]
    return ksa.SVRGroupedQueryAttention(
        head_dim=3,
        num_query_heads=heads,
        num_key_value_heads=heads // 2,
        **options,
    )


def make_inputs(num_queries=T, num_keys=S, seed=0, self_attention=False):
    rng = np.random.default_rng(seed)
    query = rng.normal(size=(B, num_queries, 6)).astype("float32")
    if self_attention:
        return query, query, None
    value = rng.normal(size=(B, num_keys, 5)).astype("float32")
    key = rng.normal(size=(B, num_keys, 8)).astype("float32")
    return query, value, key


def make_masks(kind, num_queries, num_keys, seed=0):
    """(attention_mask for the layer, value_mask, causal flag)."""
    rng = np.random.default_rng(seed + 1)
    lengths = np.array([num_keys, num_keys - 4])
    padding = np.arange(num_keys)[None] < lengths[:, None]
    if kind == "none":
        return None, None, False
    if kind == "padding":
        return None, padding, False
    if kind == "causal":
        return None, None, True
    if kind == "padding+causal":
        return None, padding, True
    if kind == "random":
        mask = rng.random((B, num_queries, num_keys)) < 0.6
        mask[0, 2] = False  # a row that sees no key
        return mask, None, False
    raise ValueError(kind)


def reference(
    layer,
    mode,
    query,
    value,
    key,
    attention_mask,
    value_mask,
    causal,
    kernel="softmax",
    query_mask=None,
    num_prefix_tokens=0,
):
    """The NumPy reference with `layer`'s weights and the options of
    `MODES[mode]` (never read off the layer under test)."""
    options = MODES[mode]
    mask = None
    if attention_mask is not None:
        mask = attention_mask
    if value_mask is not None:
        mask = (
            np.ones((B, query.shape[1], value.shape[1]), bool)
            & value_mask[:, None, :]
        )
    if query_mask is not None:
        mask = (True if mask is None else mask) & query_mask[:, :, None]
    return ref.svr_attention(
        query.astype("float64"),
        value.astype("float64"),
        attention_weights(layer),
        key=None if key is None else key.astype("float64"),
        mask=mask,
        causal_mask=causal,
        beta=options.get("beta", 0.0),
        standardize=options.get("standardize", False),
        head_factors=options.get("head_factors"),
        num_prefix_tokens=num_prefix_tokens,
        kernel=kernel,
    )
