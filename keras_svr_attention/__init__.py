"""Attention layers derived from support vector regression, for Keras 3."""

from keras_svr_attention import functional
from keras_svr_attention.layers.presets import AttentionBN
from keras_svr_attention.layers.presets import AttentionBNSH
from keras_svr_attention.layers.presets import AttentionSH
from keras_svr_attention.layers.svr_attention import SVRAttention

__version__ = "0.1.0"

__all__ = [
    "AttentionBN",
    "AttentionBNSH",
    "AttentionSH",
    "SVRAttention",
    "functional",
]
