"""The examples reach the accuracies their issue promises (slow: trains).

Run with `nox -s slow`; each test trains one attention for one seed with
the example's default settings.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _run(script, tmp_path, *args):
    out = tmp_path / "out"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", script),
            "--seeds",
            "1",
            "--output",
            str(out),
            *args,
        ],
        check=True,
        cwd=ROOT,
    )
    with open(out / "results.json") as f:
        return json.load(f)["summary"]


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["bn+sh"])
def test_timeseries_example_reaches_98_5_percent(attention, tmp_path):
    pytest.importorskip("aeon")
    rows = _run(
        "timeseries_classification.py", tmp_path, "--attention", attention
    )
    assert rows[0]["test_accuracy"] >= 98.5


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["bn+sh"])
def test_image_example_reaches_95_percent_on_digits(attention, tmp_path):
    pytest.importorskip("sklearn")
    rows = _run("image_classification.py", tmp_path, "--attention", attention)
    assert rows[0]["test_accuracy"] >= 95.0
