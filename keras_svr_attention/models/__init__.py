"""Transformer blocks and model builders using the SVR attentions."""
