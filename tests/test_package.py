"""Package rules: exports, serializable registry, import layering and
function length (AST), and how much of the package one forward reads."""

import ast
import pathlib
import sys

import keras
import numpy as np
import pytest

import keras_svr_attention as ksa

PACKAGE = pathlib.Path(ksa.__file__).parent
FORBIDDEN = {"tensorflow", "jax", "torch", "matplotlib", "keras.src"}
# Which internal modules each subpackage or top-level module may import
# (dependencies point down).
LAYERING = {
    "api_export": set(),
    "datasets": set(),
    "functional": {"functional"},
    "ops": {"functional", "api_export"},
    "layers": {"functional", "layers", "api_export"},
    "convert": {"functional", "layers", "ops", "convert", "api_export"},
    "models": {"functional", "layers", "models", "api_export"},
    "diagnostics": {"functional", "layers", "models", "diagnostics"},
}


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node, node.module


def _module_level(tree, node):
    return node in tree.body


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name
)
def test_package_imports_no_backend_and_respects_layering(path):
    tree = ast.parse(path.read_text())
    sub = path.relative_to(PACKAGE).with_suffix("").parts[0]
    assert sub in LAYERING or sub == "__init__", f"{path}: not in LAYERING"
    for node, name in _imports(path):
        root = name.split(".")[0]
        if name.startswith("keras.src") or (
            root in FORBIDDEN and _module_level(tree, node)
        ):
            raise AssertionError(f"{path}: imports {name}")
        if root == "keras_svr_attention" and sub in LAYERING:
            target = name.split(".")[1] if "." in name else None
            assert target in LAYERING[sub], f"{path}: imports {name}"


def test_package_exports_and_registry():
    for name in [
        "SVRAttention",
        "AttentionBN",
        "AttentionSH",
        "LinearAttention",
        "SparseAttention",
        "AttentionBNSH",
    ]:
        cls = getattr(ksa, name)
        assert name in ksa.__all__
        registered = keras.saving.get_registered_name(cls)
        assert registered == f"keras_svr_attention>{name}"
        assert keras.saving.get_registered_object(registered) is cls


def test_presets_defaults_follow_spec():
    assert ksa.AttentionBN(4, 8).beta == 1.0
    assert ksa.AttentionSH(8, 8).head_factors == (1, 1, 2, 2, 4, 4, 8, 8)
    layer = ksa.AttentionBNSH(4, 8)
    assert layer.beta == 1.0 and layer.head_factors == (1, 1, 2, 2)


# A function longer than this says why on the line before its `def`.
MAX_FUNCTION_LINES = 60
LONG_MARK = "# Long:"


def _functions(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _code_lines(node):
    """Lines of a function, its docstring left out."""
    lines = node.end_lineno - node.lineno + 1
    doc = ast.get_docstring(node, clean=False)
    if doc is not None:
        first = node.body[0]
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_no_function_is_over_sixty_lines_unless_it_says_why():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text().splitlines()
        for node in _functions(path):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            marked = LONG_MARK in source[start - 2] if start > 1 else False
            if _code_lines(node) > MAX_FUNCTION_LINES and not marked:
                long.append(f"{path.name}:{node.lineno} {node.name}")
    assert not long, long


def _definitions_touched(run):
    """The package's own functions and methods that `run()` calls."""
    seen = set()

    def profile(frame, event, arg):
        code = frame.f_code
        if (
            event == "call"
            and code.co_filename.startswith(str(PACKAGE))
            and not code.co_name.startswith("<")  # lambdas, comprehensions
        ):
            seen.add((code.co_filename, code.co_qualname))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


# Issue 26: a reader follows one forward in one sitting. Before the one
# functional forward, BN+SH causal touched 40 definitions and GQA 37.
MAX_DEFINITIONS_PER_FORWARD = 26


@pytest.mark.parametrize("layer", ["svr", "gqa"])
def test_one_bn_sh_causal_forward_reads_few_definitions(layer):
    x = np.random.default_rng(0).normal(size=(2, 8, 16)).astype("float32")
    if layer == "svr":
        attention = ksa.AttentionBNSH(num_heads=4, key_dim=4)
    else:
        attention = ksa.SVRGroupedQueryAttention(
            head_dim=4,
            num_query_heads=4,
            num_key_value_heads=2,
            beta=1.0,
            head_factors=[1, 2],
        )
    attention(x, x)  # built
    touched = _definitions_touched(
        lambda: attention(x, x, use_causal_mask=True)
    )
    assert 10 < len(touched) <= MAX_DEFINITIONS_PER_FORWARD, sorted(touched)
