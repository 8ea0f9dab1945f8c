"""The ```python examples in the public docstrings run (the `>>>` ones run
as doctests through pytest's --doctest-modules)."""

import inspect
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
