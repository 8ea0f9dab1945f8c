"""Converting existing models: every MultiHeadAttention becomes SVR attention.

`replace_attention` (in `replace`) finds the attention layers and builds
the converted copy; `_record` keeps the conversion in the copy's config so
that `.keras` loading replays it; `_llm_hook` gives decoder-LLM attention
layers the SVR hook; `_keras_internals` holds the private Keras pieces.
"""

from keras_svr_attention.convert.replace import replace_attention

__all__ = ["replace_attention"]
