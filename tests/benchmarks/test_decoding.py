"""benchmarks/decoding.py runs, and what each step carries is what the
design says: a linear state of fixed size, caches that grow, and pooled
heads that keep about 1 / r of the slots."""

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
    path = os.path.join(folder, "decoding.py")
    spec = importlib.util.spec_from_file_location("decoding_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)  # its `from speed import ...`, as when run
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def test_each_mode_carries_what_its_state_holds(bench, tmp_path):
    argv = ["--contexts", "16,64", "--repeats", "2", "--no-memory"]
    argv += ["--variants", "softmax,bn+sh,linear-bn+sh", "--prefill-max", "16"]
    result = bench.main([*argv, "--output", str(tmp_path)])
    size = {
        (r["variant"], r["context"]): r["decode_bytes"]
        for r in result["decoding"]
    }
    assert size[("linear-bn+sh", 16)] == size[("linear-bn+sh", 64)]
    # Keys and values (B, N, L + 1, D) float32, one slot flag each.
    assert size[("softmax", 64)] == 65 * (2 * bench.WIDTH * 4 + 1) + 4
    assert size[("softmax", 16)] < size[("softmax", 64)]
    # Factors 1, 1, 2, 2, 4, 4, 8, 8: about half the slots (0.47 and the
    # open windows), and growing.
    assert size[("bn+sh", 64)] < 0.55 * size[("softmax", 64)]
    assert size[("bn+sh", 16)] < size[("bn+sh", 64)]
    assert all(r["ms_per_token"] > 0 for r in result["decoding"])
    prefilled = [r for r in result["decoding"] if r["prefill_ms"]]
    assert {r["context"] for r in prefilled} == {16}
    backend = result["backend"]
    assert (tmp_path / f"decoding_{backend}.md").exists()
