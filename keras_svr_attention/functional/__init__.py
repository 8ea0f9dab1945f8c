"""Pure `keras.ops` functions behind the layers: tensors in, tensors out."""
