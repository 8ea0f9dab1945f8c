"""Attention maps and head redundancy, with plotting helpers."""
