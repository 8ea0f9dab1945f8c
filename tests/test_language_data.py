"""load_text and mqar against their definitions, checked by hand."""

import ast
import os
import sysconfig
import zlib

import numpy as np
import pytest

from keras_svr_attention import datasets
from tests.testing import backend_independent

pytestmark = backend_independent  # NumPy and files only


@pytest.fixture(scope="module")
def stdlib():
    return datasets.load_text()


def _module_docstring(module):
    with open(os.path.join(sysconfig.get_paths()["stdlib"], module)) as f:
        return ast.get_docstring(ast.parse(f.read())).encode()


@pytest.mark.parametrize("module", ["copy.py", "json/decoder.py", "glob.py"])
def test_a_modules_docstrings_lie_in_the_split_its_path_names(stdlib, module):
    split = {0: "test", 1: "validation"}.get(
        zlib.crc32(module.encode()) % 20, "train"
    )
    doc = _module_docstring(module)
    assert doc in stdlib[split]
    for other in set(stdlib) - {split}:
        assert doc not in stdlib[other]


def test_the_stdlib_text_is_english_sized_and_split_about_90_5_5(stdlib):
    sizes = {k: len(v) for k, v in stdlib.items()}
    total = sum(sizes.values())
    assert total > 1_000_000, sizes
    assert 0.8 < sizes["train"] / total < 0.97, sizes
    assert min(sizes["validation"], sizes["test"]) > 0.02 * total, sizes
    # Docstrings, not code: the commonest bytes are letters and spaces.
    counts = np.bincount(np.frombuffer(stdlib["test"], np.uint8), minlength=256)
    assert set(np.argsort(counts)[-4:]) <= set(b" etaoinsr\n")
    assert datasets.load_text() == stdlib  # the same bytes every call


def test_a_file_is_cut_in_order_90_5_5(tmp_path):
    data = bytes(range(256)) * 4
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    text = datasets.load_text(str(path))
    assert text["train"] + text["validation"] + text["test"] == data
    assert (len(text["train"]), len(text["validation"])) == (921, 51)


def test_an_unknown_text_source_is_refused_by_name():
    with pytest.raises(ValueError, match="`source` must be 'stdlib'"):
        datasets.load_text("no/such/file.txt")


@pytest.mark.parametrize("length,pairs,vocabulary", [(64, 8, 128), (32, 8, 40)])
def test_each_query_asks_a_key_of_the_context_for_its_value(
    length, pairs, vocabulary
):
    x, y, w = datasets.mqar(50, length, pairs, vocabulary, seed=3)
    assert x.shape == y.shape == w.shape == (50, length)
    half = vocabulary // 2
    for row in range(50):
        keys, values = x[row, : 2 * pairs : 2], x[row, 1 : 2 * pairs : 2]
        assert len(set(keys)) == len(set(values)) == pairs
        assert keys.min() >= 1 and keys.max() < half
        assert values.min() >= half and values.max() < vocabulary
        (queries,) = np.nonzero(w[row])
        assert len(queries) == pairs and set(w[row]) <= {0.0, 1.0}
        assert queries.min() >= 2 * pairs
        assert np.all((queries - 2 * pairs) % 2 == 0)
        assert sorted(x[row, queries]) == sorted(keys)
        for q in queries:
            (at,) = np.nonzero(keys == x[row, q])
            assert y[row, q] == values[at[0]]
    assert np.all(y[w == 0] == 0)
    np.testing.assert_array_equal(
        datasets.mqar(50, length, pairs, vocabulary, seed=3)[0], x
    )


def test_short_gaps_between_context_and_query_are_likelier():
    _, _, w = datasets.mqar(2000, 64, 4, 128, seed=0)
    first, last = w[:, 8].mean(), w[:, 62].mean()
    assert first > 1.5 * last, (first, last)


@pytest.mark.parametrize(
    "args,message",
    [
        ((4, 30, 8, 128), "`sequence_length` must be even and at least 4"),
        ((4, 33, 2, 128), "`sequence_length` must be even"),
        ((4, 64, 8, 64), "`vocabulary_size` must exceed"),
    ],
)
def test_mqar_sizes_that_do_not_fit_are_refused_by_name(args, message):
    with pytest.raises(ValueError, match=message):
        datasets.mqar(*args)
