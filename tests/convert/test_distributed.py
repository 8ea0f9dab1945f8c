"""Converted models under keras.distribution on two virtual CPU devices."""

import os
import pathlib
import subprocess
import sys

import pytest

from tests.testing import BACKEND

SCRIPT = (
    pathlib.Path(__file__).parents[1] / "scripts" / "distributed_conversion.py"
)


@pytest.mark.slow  # a subprocess on two virtual devices: `nox -s slow`
@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution is JAX's")
def test_converted_model_gives_one_devices_outputs_when_sharded():
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "PYTHONPATH": str(SCRIPT.parents[2]),
    }
    result = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(
        line.split(" ", 1) for line in result.stdout.splitlines() if " " in line
    )
    for check in (
        "model_parallel/bn",
        "model_parallel/bn+sh",
        "data_parallel/bn+sh",
    ):
        assert float(lines[check]) < 1e-5, (check, lines[check])
    # The heads really were sharded over the "model" axis.
    assert lines["sharding/bn+sh"] == "P(None,'model',None)"
