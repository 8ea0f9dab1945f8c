import os

import keras
import pytest

if keras.backend.backend() == "torch" and not os.environ.get(
    "KSA_TORCH_INDUCTOR"
):
    import torch

    _torch_compile = torch.compile

    def _compile_with_aot_eager(model=None, **kwargs):
        """`torch.compile` as Keras calls it for `jit_compile=True`, on the
        `aot_eager` backend: dynamo traces the step and AOTAutograd
        functionalizes it (where a layer breaks under torch.compile), but
        inductor does not generate and build C++ for each graph (the model
        battery and the GQA training test: 245 s on inductor, 162 s on
        aot_eager, measured on two cores). `nox -s slow` sets
        KSA_TORCH_INDUCTOR=1 and runs the compiled tests on inductor."""
        kwargs.setdefault("backend", "aot_eager")
        return _torch_compile(model, **kwargs)

    torch.compile = _compile_with_aot_eager

if keras.backend.backend() == "jax":
    # Eager JAX lowers and compiles every op for every new shape, and JAX
    # makes a fresh MLIR context (loading every dialect) for each lowering:
    # half the lowering time, and most of the process's memory. The tests
    # lower one module at a time on one thread, so one context serves them
    # all (measured on three test files in one process: 152 s -> 104 s,
    # peak memory 3.9 GB -> 1.4 GB). A private JAX function: if it moves,
    # the tests run as before.
    try:
        from jax._src.interpreters import mlir as _mlir
    except ImportError:
        _mlir = None
    if callable(getattr(_mlir, "make_ir_context", None)):
        _context = _mlir.make_ir_context()
        _mlir.make_ir_context = lambda: _context


@pytest.fixture(autouse=True)
def _reset_policy():
    """Every test starts and ends under the float32 policy, seeded.

    The seed makes a layer's initial weights, and so every tolerance that
    depends on them, the same on each run: a failure reproduces.
    """
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")
