"""Pure `keras.ops` functions behind the layers: tensors in, tensors out.

The rules they implement (statistics, visibility, windows, prefix tokens,
causal windows, caches) are stated on a page of the user guide, The rules
(`docs/guide/rules.md`); docstrings cite its sections by name, as in
(the rules page, "Windows").
"""
