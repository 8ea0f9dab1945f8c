"""Test helpers: tolerances, backend-specific gradients, layer weights."""

import keras
import numpy as np
import pytest

BACKEND = keras.config.backend()

# Eager JAX compiles every op for every new shape: tests that sweep many
# shapes or finite differences run on JAX in `nox -s slow` only (on the
# other backends in the default matrix too).
slow_on_jax = pytest.mark.slow if BACKEND == "jax" else pytest.mark.fast


def assert_allclose(actual, desired, atol=1e-5, rtol=1e-5, err_msg=""):
    np.testing.assert_allclose(
        np.asarray(keras.ops.convert_to_numpy(actual), dtype="float64"),
        np.asarray(keras.ops.convert_to_numpy(desired), dtype="float64"),
        atol=atol,
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
