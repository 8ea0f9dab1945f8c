"""Layers: thin owners of weights and config over `functional/`."""
