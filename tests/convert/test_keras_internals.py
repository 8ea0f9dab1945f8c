"""Pins each private Keras piece that `_keras_internals` uses to the
installed Keras (the matrix runs the newest we support; `nox -s floor` our
Keras floor), each against what public API says it must give."""

import keras
import numpy as np

from keras_svr_attention.convert import _keras_internals as internals


def _model():
    inputs = keras.Input((4, 6))
    block = keras.Sequential(
        [keras.layers.Dense(6, name="inner"), keras.layers.Dense(6)],
        name="block",
    )
    x = block(inputs)
    x = keras.layers.MultiHeadAttention(2, 3, name="attention")(x, x)
    return keras.Model(inputs, x)


def test_flatten_layers_and_sublayers_agree_with_public_layers():
    model = _model()
    assert internals.sublayers(model) == model.layers
    flat = internals.flatten_layers(model)
    block = model.get_layer("block")
    # Depth first: the block's layers come after it.
    assert all(flat.index(sub) > flat.index(block) for sub in block.layers)
    assert len({id(layer) for layer in flat}) == len(flat)
    assert model.get_layer("attention") in flat
    assert internals.flatten_layers(model, include_self=True)[0] is model


def test_variables_are_each_layers_own_weights():
    layer = _model().get_layer("attention")
    assert internals.variables(layer) == []  # its weights live in sublayers
    ids = {
        id(v)
        for sub in internals.flatten_layers(layer, include_self=True)
        for v in internals.variables(sub)
    }
    assert ids == {id(w) for w in layer.weights}


def test_swap_sublayer_keeps_tracking_order_and_weights():
    outer = keras.layers.Layer()
    outer.first = keras.layers.Dense(2)
    outer.second = keras.layers.Dense(3)
    old = outer.first
    assert internals.attribute_holding(outer, old) == "first"
    new = keras.layers.Dense(5)
    new.build((None, 4))
    internals.swap_sublayer(outer, "first", old, new)
    assert internals.sublayers(outer) == [new, outer.second]
    assert outer.first is new
    assert len(outer.weights) == 2  # only the new layer is built


def test_attention_build_shapes_rebuild_the_same_weights():
    layer = keras.layers.MultiHeadAttention(2, 3)
    layer.build((None, None, 6), (None, None, 5), (None, None, 4))
    twin = keras.layers.MultiHeadAttention(2, 3)
    twin.build(**internals.attention_build_shapes(layer))
    assert [w.shape for w in twin.weights] == [w.shape for w in layer.weights]
    called = keras.layers.MultiHeadAttention(2, 3)
    x = np.zeros((1, 4, 6), "float32")
    called(x, x)
    shapes = internals.attention_build_shapes(called)
    assert shapes["query_shape"][-1] == 6
