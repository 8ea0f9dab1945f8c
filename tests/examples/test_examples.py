"""The example scripts from the command line, as a newcomer meets them.

They run as subprocesses (tests never import the example scripts).
"""

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.testing import backend_independent

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
SCRIPTS = [
    "timeseries_classification.py",
    "image_classification.py",
    "image_augmentation.py",
    "data_parallel.py",
    "convert_pretrained.py",
    "lm_uptraining.py",
    "mqar.py",
]


def _run(script, *args, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@backend_independent
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_needs_no_backend_and_shows_defaults(script, tmp_path):
    # A `keras` that fails on import: --help must not import it.
    (tmp_path / "keras").mkdir()
    (tmp_path / "keras" / "__init__.py").write_text(
        "raise ImportError('keras was imported')\n"
    )
    done = _run(script, "--help", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    # Option blocks: each starts with a line "  --name ..." (or "  -h").
    blocks, text = [], done.stdout.split("options:")[1]
    for line in text.splitlines():
        if line.startswith("  -"):
            blocks.append(line)
        elif blocks:
            blocks[-1] += " " + line.strip()
    blocks = [b for b in blocks if not b.startswith("  -h")]
    assert len(blocks) >= 8
    flags = ("--smoke", "--mixed-precision")
    for block in blocks:
        assert len(block.split()) > 2, f"no description: {block}"
        if not block.split()[0].startswith(flags):
            assert "(default:" in block, block


@backend_independent
@pytest.mark.parametrize(
    "args, message",
    [
        (["--head-factors", "1,2"], "one integer >= 1 per head"),
        (["--head-factors", "1,x"], "comma-separated integers"),
        (["--attention", "bn,nope"], "`attention` must be one of"),
        (["--epochs", "0"], "must be >= 1"),
        (["--dropout", "1.5"], "must be in [0, 1)"),
        (["--width", "60"], "multiple of --num-heads"),
    ],
)
def test_bad_options_fail_in_one_line_before_training(args, message, tmp_path):
    done = _run(
        "timeseries_classification.py", *args, "--output", str(tmp_path)
    )
    assert done.returncode == 2
    error = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and message in error[0], done.stderr
    assert "Traceback" not in done.stderr
    assert "[1/" not in done.stdout  # no run started


@backend_independent
def test_a_set_that_needs_a_download_fails_in_one_line(tmp_path):
    pytest.importorskip("aeon")
    done = _run(
        "timeseries_classification.py",
        *("--dataset", "NoSuchSet", "--output", str(tmp_path)),
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    # One error line (backends may log their own start-up lines).
    (line,) = [x for x in done.stderr.splitlines() if ": error: " in x]
    assert "not one of the sets inside aeon" in line


@pytest.mark.slow  # trains: `nox -s slow` (and `nox -s examples` runs it)
def test_smoke_run_logs_plain_lines_and_writes_full_results(tmp_path):
    pytest.importorskip("aeon")
    pytest.importorskip("matplotlib")
    done = _run(
        "timeseries_classification.py",
        *("--smoke", "--attention", "softmax,sh", "--output", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "[1/2] softmax seed 0" in lines and "[2/2] sh seed 0" in lines
    epochs = [line for line in lines if line.startswith("  epoch 1/1 ")]
    assert len(epochs) == 2 and all("test_accuracy" in e for e in epochs)
    assert "\x1b" not in done.stdout and "\r" not in done.stdout
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["dataset"] == "JapaneseVowels"
    assert results["backend"] == os.environ["KERAS_BACKEND"]
    assert results["versions"]["keras"]
    assert results["hyperparameters"]["learning_rate"] == 3e-3
    assert [r["seed"] for r in results["runs"]] == [0, 0]
    run = results["runs"][0]
    assert run["test_accuracy"] == run["test_accuracy_per_epoch"][-1]
    assert run["best_epoch_test_accuracy"] == max(
        run["test_accuracy_per_epoch"]
    )
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["attention"] for r in rows] == ["softmax", "sh"]
    assert rows[0]["dataset"] == "JapaneseVowels"
    assert rows[0]["keras version"] and rows[0]["backend"]
    for name in ("curves", "diversity", "maps_softmax", "maps_sh"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    table = (tmp_path / "results.md").read_text()
    assert "final epoch" in table and "paper's protocol" in table


@pytest.mark.slow  # trains: `nox -s slow` (and `nox -s examples` runs it)
@pytest.mark.parametrize(
    "script,args,other",
    [
        ("lm_uptraining.py", ["--modes", "softmax,bn+sh"], "--fractions=0.5"),
        ("mqar.py", ["--modes", "softmax,linear"], "--widths=16"),
    ],
)
def test_the_lm_studies_write_their_table_and_resume(
    script, args, other, tmp_path
):
    pytest.importorskip("keras_hub")
    out = ["--smoke", *args, "--output", str(tmp_path)]
    first = _run(script, *out)
    assert first.returncode == 0, first.stderr[-2000:]
    table = (tmp_path / "results.md").read_text()
    body = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(body) == 3, table  # the head, then one row per mode
    assert "nan" not in table
    runs = sorted(p.name for p in tmp_path.glob("*.json"))

    def trained(done):  # each run logs one line ending in its time
        return [x for x in done.stdout.splitlines() if x.endswith(" s)")]

    assert trained(first)
    # Everything is on disk: a second run trains nothing and writes the
    # same table.
    again = _run(script, *out)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not trained(again)
    assert (tmp_path / "results.md").read_text() == table
    assert sorted(p.name for p in tmp_path.glob("*.json")) == runs
    # Another configuration in the same folder is refused.
    refused = _run(script, *out, other)
    assert refused.returncode != 0
    assert "another configuration" in refused.stderr
