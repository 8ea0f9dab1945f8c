"""The ```python examples in the public docstrings run (the `>>>` ones run
as doctests through pytest's --doctest-modules)."""

import inspect
import pathlib
import pkgutil
import re

import pytest

import keras_svr_attention as ksa

BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _public_objects():
    seen = {}
    modules = [ksa]
    for info in pkgutil.walk_packages(ksa.__path__, "keras_svr_attention."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            modules.append(__import__(info.name, fromlist=["_"]))
    for module in modules:
        for name, obj in vars(module).items():
            if name.startswith("_") or not callable(obj):
                continue
            if getattr(obj, "__module__", "").startswith(ksa.__name__):
                seen[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return seen


EXAMPLES = [
    pytest.param(obj, code, id=f"{path}[{i}]")
    for path, obj in sorted(_public_objects().items())
    for i, code in enumerate(BLOCK.findall(inspect.getdoc(obj) or ""))
]


def test_docstrings_have_python_examples():
    assert len(EXAMPLES) >= 5, len(EXAMPLES)


@pytest.mark.parametrize("obj,code", EXAMPLES)
def test_docstring_example_runs(obj, code):
    namespace = dict(vars(inspect.getmodule(obj)))
    exec(compile(code, f"<docstring of {obj.__qualname__}>", "exec"), namespace)


RULES = pathlib.Path(__file__).parents[1] / "docs" / "guide" / "rules.md"
CITATION = re.compile(r"rules\s+page[^)]*", re.DOTALL)


def test_rules_page_citations_name_its_sections_and_no_spec_file():
    """Every section a docstring cites ("the rules page, "Windows"") is a
    heading of docs/guide/rules.md, and no file of the repository points to
    a specification file that it does not hold."""
    sections = set(re.findall(r"^## (.+)$", RULES.read_text(), re.MULTILINE))
    cited = set()
    for path in pathlib.Path(ksa.__file__).parent.rglob("*.py"):
        text = path.read_text()
        assert "SPEC" not in text, path
        for citation in CITATION.findall(text):
            cited.update(re.findall(r'"([^"]+)"', citation))
    assert len(cited) >= 6, cited
    assert cited <= sections, cited - sections
    root = RULES.parents[2]
    for pattern in ("*.py", "*.md", "*.yml", "*.toml"):
        for path in root.rglob(pattern):
            parts = path.relative_to(root).parts
            if parts[0].startswith(".") or parts[0] in ("site", "build"):
                continue
            assert "SPEC" + ".md" not in path.read_text(), path
