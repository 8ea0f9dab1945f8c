"""Attention layers derived from support vector regression, for Keras 3."""

from keras_svr_attention import datasets
from keras_svr_attention import diagnostics
from keras_svr_attention import functional
from keras_svr_attention import models
from keras_svr_attention.convert import replace_attention
from keras_svr_attention.diagnostics.heads import attention_maps
from keras_svr_attention.diagnostics.heads import head_redundancy
from keras_svr_attention.layers.grouped_query_attention import (
    SVRGroupedQueryAttention,
)
from keras_svr_attention.layers.presets import AttentionBN
from keras_svr_attention.layers.presets import AttentionBNSH
from keras_svr_attention.layers.presets import AttentionSH
from keras_svr_attention.layers.presets import LinearAttention
from keras_svr_attention.layers.presets import SparseAttention
from keras_svr_attention.layers.presets import get
from keras_svr_attention.layers.presets import options_used_by
from keras_svr_attention.layers.svr_attention import SVRAttention
from keras_svr_attention.models.encoder import StochasticDepth
from keras_svr_attention.models.encoder import TransformerEncoderBlock
from keras_svr_attention.models.timeseries import timeseries_classifier
from keras_svr_attention.models.vit import VIT_PRESETS
from keras_svr_attention.models.vit import vit_classifier
from keras_svr_attention.ops import svr_dot_product_attention

__version__ = "0.1.0"

__all__ = [
    "AttentionBN",
    "AttentionBNSH",
    "AttentionSH",
    "LinearAttention",
    "SparseAttention",
    "SVRAttention",
    "SVRGroupedQueryAttention",
    "StochasticDepth",
    "TransformerEncoderBlock",
    "VIT_PRESETS",
    "attention_maps",
    "datasets",
    "diagnostics",
    "functional",
    "get",
    "head_redundancy",
    "models",
    "options_used_by",
    "replace_attention",
    "svr_dot_product_attention",
    "timeseries_classifier",
    "vit_classifier",
]
