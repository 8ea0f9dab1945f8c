"""The offline suite's protocol: tuning, resuming, choosing, testing."""

import importlib.util
import os
import shutil

import numpy as np
import pytest

from tests.testing import backend_independent

pytestmark = backend_independent  # NumPy and files only

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


@pytest.fixture(scope="module")
def suite():
    path = os.path.join(ROOT, "benchmarks", "offline_suite.py")
    spec = importlib.util.spec_from_file_location("offline_suite", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_candidates_are_seeded_and_drawn_from_the_space(suite):
    first, again = suite.candidates(5), suite.candidates(5)
    assert first == again and len(first) == 5
    for config in first:
        assert all(config[k] in v for k, v in suite.SPACE.items())
    assert len({tuple(c.values()) for c in first}) > 1


def test_validation_split_is_stratified_inside_the_training_set(suite):
    y = np.repeat(np.arange(3), [8, 8, 4])
    train = suite.Split(np.arange(20)[:, None], np.ones((20, 1), bool), y)
    fit, val = suite.validation_split(train)
    assert sorted([*fit.x[:, 0], *val.x[:, 0]]) == list(range(20))
    assert len(val.y) == 5 and set(val.y) == {0, 1, 2}
    assert np.array_equal(train.y[fit.x[:, 0]], fit.y)


def test_runs_resume_from_the_cache_and_test_the_chosen_candidate(
    suite, tmp_path, monkeypatch
):
    calls = []

    def fake_train(attention, config, *, evaluate, seed, **unused):
        calls.append((attention, config["width"], seed, len(evaluate.y)))
        # Candidate 1 wins on validation accuracy; test runs score 90 + seed.
        index = [c["width"] for c in configs].index(config["width"])
        accuracy = (
            {0: 50.0, 1: 80.0, 2: 80.0, 3: 0.0}[index] if seed == 0 else 0
        )
        return {
            "accuracy": accuracy if len(evaluate.y) < 10 else 90.0 + seed,
            "loss": {0: 1.0, 1: 0.5, 2: 0.7, 3: 0.1}[index],
            "best_epoch_accuracy": 95.0,
            "train_seconds": 1.0,
        }

    configs = [dict(c, width=w) for c, w in zip(
        suite.candidates(3), (16, 32, 48), strict=True
    )]  # fmt: skip
    monkeypatch.setattr(suite, "candidates", lambda count: configs)
    monkeypatch.setattr(suite, "train_once", fake_train)
    y = np.repeat(np.arange(2), 10)
    data = ((np.zeros((20, 4, 1)), np.ones((20, 4), bool), y),) * 2
    import keras_svr_attention.datasets as datasets

    monkeypatch.setattr(datasets, "load_uea", lambda n, m: (*data, ["a", "b"]))
    args = suite.parse_args(
        ["--datasets", "UnitTest", "--attentions", "softmax", "--seeds", "2"]
        + ["--output", str(tmp_path)]
    )
    assert suite.run_suite(args) == 5  # 3 candidates, 2 seeds
    tuned = [c for c in calls if c[3] < 10]
    tested = [c for c in calls if c[3] == 20]
    assert [c[1] for c in tuned] == [16, 32, 48]
    # Candidates 1 and 2 tie on accuracy; 1 has the lower loss.
    assert [(c[1], c[2]) for c in tested] == [(32, 0), (32, 1)]
    calls.clear()
    assert suite.run_suite(args) == 0 and calls == []  # all cached
    cache = suite.Cache(os.path.join(str(tmp_path), "runs"))
    run = cache.get(suite.RunKey("UnitTest", "softmax", "test", 1))
    assert run["candidate"] == 1 and run["accuracy"] == 91.0
    path = os.path.join("UnitTest", "softmax", "test", "test1.json")
    assert os.path.isfile(os.path.join(cache.root, path))
    # A fourth candidate that wins: tuning runs stay, test runs redo.
    configs.append(dict(configs[0], width=64))
    scores = {16: 50.0, 32: 80.0, 48: 80.0, 64: 99.0}
    monkeypatch.setattr(
        suite,
        "train_once",
        lambda attention, config, **kw: {
            **fake_train(attention, config, **kw),
            "accuracy": (
                scores[config["width"]] if len(kw["evaluate"].y) < 10 else 70.0
            ),
        },
    )
    calls.clear()
    args.candidates = 4
    assert suite.run_suite(args) == 3  # candidate 3, then two test seeds
    assert [(c[1], c[3] == 20) for c in calls] == [
        (64, False), (64, True), (64, True)
    ]  # fmt: skip
    assert [r["candidate"] for r in suite.collect(cache, args, configs)[
        "UnitTest"]["softmax"]] == [3, 3]  # fmt: skip


def test_paired_test_counts_and_means_by_hand(suite):
    from scipy.stats import wilcoxon

    base = [90.0, 80.0, 70.0, 60.0, 85.0, 75.0]
    ours = [91.0, 80.0, 72.0, 59.0, 88.0, 79.0]
    runs = lambda values: [{"accuracy": v} for v in values]  # noqa: E731
    table = {
        "A": {"softmax": runs(base[:3]), "bn": runs(ours[:3])},
        "B": {"softmax": runs(base[3:]), "bn": runs(ours[3:])},
    }
    text, result = suite.paired_tests(table, ["softmax", "bn"], "accuracy")
    diff = np.subtract(ours, base)
    assert result["bn"]["pairs"] == 6
    assert result["bn"]["mean"] == pytest.approx(diff.mean())
    assert "| bn | 6 | +1.50 | 4 / 1 / 1 |" in text
    nonzero = diff[diff != 0]
    assert result["bn"]["p"] == pytest.approx(wilcoxon(nonzero).pvalue)


PUBLISHED = os.path.join(ROOT, "benchmarks", "results", "offline_suite")


def test_gitignore_keeps_the_published_runs():
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    import subprocess

    paths = [
        "benchmarks/results/offline_suite/runs/GunPoint/bn_sh/test/test0.json",
        "benchmarks/results/offline_suite_jv5/runs/JapaneseVowels/sh/tune/"
        "tune4.json",
    ]
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and not done.stdout, done.stdout  # none
    # What the examples write by default stays out.
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "runs/ts/results.json"], cwd=ROOT
    )
    assert ignored.returncode == 0


@pytest.mark.parametrize(
    "folder, options",
    [
        ("offline_suite", []),
        (
            "offline_suite_jv5",
            ["--datasets", "JapaneseVowels", "--candidates", "5"],
        ),
    ],
)
def test_report_rebuilds_the_published_report_from_the_committed_runs(
    suite, folder, options, tmp_path
):
    for module in ("scipy", "aeon", "matplotlib"):
        pytest.importorskip(module)
    published = os.path.join(ROOT, "benchmarks", "results", folder)
    shutil.copytree(os.path.join(published, "runs"), tmp_path / "runs")
    suite.main(["--report", "--output", str(tmp_path), *options])
    for name in ("report.md", "summary.json"):
        with open(os.path.join(published, name)) as f:
            want = f.read()
        assert (tmp_path / name).read_text() == want, name
    if folder == "offline_suite":  # the 320 runs, and the docs' tables
        report = (tmp_path / "report.md").read_text()
        assert "from 320 cached" in report
        with open(os.path.join(ROOT, "docs", "results.md")) as f:
            docs = f.read()
        tables = [t for t in report.split("\n\n") if t.startswith("| ")]
        for table in tables[:5]:  # the accuracies and the paired tests
            assert table in docs, table
