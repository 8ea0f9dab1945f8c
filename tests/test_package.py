"""Package rules: exports, serializable registry, import layering (AST)."""

import ast
import pathlib

import keras
import pytest

import keras_svr_attention as ksa

PACKAGE = pathlib.Path(ksa.__file__).parent
FORBIDDEN = {"tensorflow", "jax", "torch", "matplotlib", "keras.src"}
# Which internal subpackages each may import (dependencies point down).
LAYERING = {
    "functional": {"functional"},
    "layers": {"functional", "layers", "api_export"},
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
    sub = (
        path.relative_to(PACKAGE).parts[0]
        if len(path.relative_to(PACKAGE).parts) > 1
        else None
    )
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
