"""benchmarks/linear_decoding.py runs, and what it carries per token is
what the design says: a state of fixed size, a cache that grows."""

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


@pytest.fixture(scope="module")
def bench():
    folder = os.path.join(ROOT, "benchmarks")
    path = os.path.join(folder, "linear_decoding.py")
    spec = importlib.util.spec_from_file_location("linear_decoding", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)  # its `from speed import ...`, as when run
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def test_the_state_keeps_its_size_and_the_cache_grows(bench, tmp_path):
    argv = ["--contexts", "8,32", "--repeats", "2", "--no-memory"]
    result = bench.main([*argv, "--output", str(tmp_path)])
    size = {
        (r["variant"], r["context"]): r["decode_bytes"]
        for r in result["decoding"]
    }
    for variant in ("linear+state", "linear+bn+sh+state"):
        assert size[(variant, 8)] == size[(variant, 32)]
    # (B, 2, L + 1, heads, key_dim) float32.
    assert size[("softmax+kv", 32)] == 2 * 33 * bench.WIDTH * 4
    assert size[("softmax+kv", 8)] < size[("softmax+kv", 32)]
    assert all(r["ms_per_token"] > 0 for r in result["decoding"])
    backend = result["backend"]
    assert (tmp_path / f"linear_decoding_{backend}.md").exists()
