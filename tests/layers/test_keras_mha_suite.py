"""Keras's own MultiHeadAttention tests, run against SVRAttention.

The test file ships inside the installed keras package
(`keras/src/layers/attention/multi_head_attention_test.py`): it is imported
from there, its `layers.MultiHeadAttention` replaced by `SVRAttention`, and
its test case collected here. Skipped, as documented: `attention_axes`
other than the sequence axis and inputs of rank > 3, which SVRAttention
refuses with a ValueError.
"""

import importlib
import types

import keras
import pytest

import keras_svr_attention as ksa

keras_tests = pytest.importorskip(
    "keras.src.layers.attention.multi_head_attention_test"
)


class _Layers(types.ModuleType):
    """`keras.layers` with SVRAttention in MultiHeadAttention's place."""

    MultiHeadAttention = ksa.SVRAttention

    def __getattr__(self, name):
        return getattr(importlib.import_module("keras.src.layers"), name)


keras_tests.layers = _Layers("layers")

# Test names (parameterized ones by their prefix) that exercise what we
# refuse: attention over other axes, or inputs of rank > 3.
REFUSED = {
    "test_high_dim_attention": "attention_axes / rank > 3",
    "test_attention_axes_negative_indexing": "attention_axes",
    "test_compute_output_shape_high_dim": "rank > 3",
    "test_compute_output_shape_different_qv_last_dims": "rank > 3",
    "test_shape_mismatch_error_key_value_dim_mismatch_high_dim": "rank > 3",
    # A key of rank 1: refused for its rank, before the sizes are compared.
    "test_shape_mismatch_error_query_value_dim_mismatch": "rank != 3",
    "test_causal_only_masks_non_4d_inputs": "rank > 3",
}


class TestKerasMultiHeadAttentionSuite(keras_tests.MultiHeadAttentionTest):
    def setUp(self):
        super().setUp()
        name = self._testMethodName
        for prefix, why in REFUSED.items():
            if name.startswith(prefix):
                self.skipTest(f"SVRAttention refuses {why}")


def test_suite_runs_against_svr_attention():
    # The substitution is real: the file's MultiHeadAttention is ours.
    assert keras_tests.layers.MultiHeadAttention is ksa.SVRAttention
    assert keras_tests.layers.Dense is keras.layers.Dense
