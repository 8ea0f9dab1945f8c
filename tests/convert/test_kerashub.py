"""KerasHub backbones converted to SVR attention (the `[hub]` extra).

Tiny backbones built from config: no preset download. BERT and ViT hold
`keras.layers.MultiHeadAttention` inside their encoder layers; GPT-2 holds
`CachedMultiHeadAttention` and decodes with a cache.
"""

import math
import os

import keras
import numpy as np
import pytest
from keras import ops

import keras_svr_attention as ksa
from tests import numpy_reference as ref
from tests.testing import assert_allclose
from tests.testing import attention_weights
from tests.testing import random_weights
from tests.testing import slow_off_torch

keras_hub = pytest.importorskip("keras_hub")


def _attention(model):
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if type(layer).__name__.endswith("MultiHeadAttention")
        or isinstance(layer, ksa.SVRAttention)
    ]


def _bert():
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=30,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=12,
        dropout=0.0,
    )
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": rng.integers(0, 30, (2, 12)).astype("int32"),
        "segment_ids": np.zeros((2, 12), "int32"),
        "padding_mask": np.arange(12)[None] < np.array([[12], [7]]),
    }
    return backbone, inputs, "sequence_output"


def _vit():
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(16, 16, 3),
        patch_size=4,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        mlp_dim=32,
    )
    images = np.random.default_rng(1).normal(size=(2, 16, 16, 3))
    return backbone, images.astype("float32"), None


def _output(model, inputs, key):
    out = model(inputs)
    return out[key] if key else out


@pytest.mark.parametrize(  # covering (suite, tests/testing.py): ViT
    "build",
    [
        pytest.param(_bert, id="bert", marks=slow_off_torch),
        pytest.param(_vit, id="vit"),
    ],
)
def test_backbone_conversion(build):
    backbone, inputs, key = build()
    random_weights(backbone)
    want = _output(backbone, inputs, key)
    same = ksa.replace_attention(backbone, "softmax")
    assert all(isinstance(a, ksa.SVRAttention) for a in _attention(same))
    assert len(_attention(same)) == 2
    assert_allclose(_output(same, inputs, key), want, 1e-5, 1e-5)
    # The CLS token of ViT is a prefix token: SH never pools it.
    prefix = 1 if build is _vit else 0
    new = ksa.replace_attention(
        backbone, "bn+sh", head_factors=[1, 1, 2, 4], num_prefix_tokens=prefix
    )
    # Each converted attention computes, on what its block gives it, the
    # paper's equations (NumPy) with the original layer's weights and the
    # requested options.
    calls = _record_calls(_attention(new))
    got = ops.convert_to_numpy(_output(new, inputs, key))
    assert np.all(np.isfinite(got))
    assert np.abs(got - ops.convert_to_numpy(want)).max() > 1e-4
    for original, (args, kwargs, output) in zip(
        _attention(backbone), calls, strict=True
    ):
        query = ops.convert_to_numpy(
            kwargs.get("query", args[0] if args else None)
        )
        value = ops.convert_to_numpy(
            kwargs.get("value", args[1] if len(args) > 1 else None)
        )
        mask = kwargs.get("attention_mask")
        mask = None if mask is None else ops.convert_to_numpy(mask)
        expected, _ = ref.svr_attention(
            query.astype("float64"),
            value.astype("float64"),
            attention_weights(original),
            mask=None if mask is None else mask.astype(bool),
            beta=1.0,
            head_factors=[1, 1, 2, 4],
            num_prefix_tokens=prefix,
        )
        assert_allclose(output, expected, 1e-4, 1e-4)
    assert len(new.weights) == len(backbone.weights)
    assert all(
        type(a).__name__ == "MultiHeadAttention" for a in _attention(backbone)
    )


def _record_calls(layers):
    """Wraps each layer's `call` to keep its arguments and output."""
    calls = []
    for layer in layers:
        record = []
        calls.append(record)

        def call(*args, _call=layer.call, _record=record, **kwargs):
            out = _call(*args, **kwargs)
            _record.extend([args, kwargs, out])
            return out

        layer.call = call
    return calls


def _gpt2_lm():
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=50,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=64,
        dropout=0.0,
    )
    random_weights(backbone, seed=3)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


@pytest.mark.parametrize(
    "attention,options",
    [
        # Softmax, BN and SH alone: the ops of BN+SH (`slow_off_torch`;
        # covering, suite, tests/testing.py).
        pytest.param("softmax", {}, marks=slow_off_torch),
        pytest.param("bn", {}, marks=slow_off_torch),
        pytest.param(
            "sh", {"head_factors": [1, 1, 2, 4]}, marks=slow_off_torch
        ),
        ("bn+sh", {"head_factors": [1, 2, 2, 4]}),
    ],
)
def test_gpt2_generates_with_a_cache_as_the_full_forward(attention, options):
    lm = _gpt2_lm()
    new = ksa.replace_attention(lm, attention, **options)
    length, prompt = 12, 3
    tokens = np.zeros((2, length), "int32")
    tokens[:, :prompt] = [[5, 7, 9], [1, 2, 3]]
    padding = np.ones((2, length), bool)
    # The decoding state: a prefill of the tokens before the prompt's last
    # (as `generate` resumes there), then one token at a time.
    new._svr_prefill_limit = ops.convert_to_tensor(prompt - 1)
    _, cache = new._build_cache(ops.convert_to_tensor(tokens))
    new._svr_prefill_limit = None
    for t in range(prompt, length):
        logits, _, cache = new.call_with_cache(
            ops.convert_to_tensor(tokens[:, t - 1 : t]), cache, t - 1
        )
        full = new({"token_ids": tokens, "padding_mask": padding})
        step = ops.convert_to_numpy(logits)[:, 0]
        assert_allclose(step, ops.convert_to_numpy(full)[:, t - 1], 1e-4, 1e-4)
        tokens[:, t] = step.argmax(-1)
        # The same greedy token from the recomputed forward.
        np.testing.assert_array_equal(
            ops.convert_to_numpy(full)[:, t - 1].argmax(-1), tokens[:, t]
        )
    if attention != "softmax":
        before = lm({"token_ids": tokens, "padding_mask": padding})
        after = new({"token_ids": tokens, "padding_mask": padding})
        diff = ops.convert_to_numpy(after) - ops.convert_to_numpy(before)
        assert np.abs(diff).max() > 1e-4


def _generate_and_teacher_force(lm):
    """Greedy `generate()` from prompts of 6 and 4 tokens, and whether one
    full causal forward over the result predicts every generated token."""
    ids = np.random.default_rng(0).integers(1, 40, (2, 16)).astype("int32")
    mask = np.zeros((2, 16), bool)
    mask[0, :6], mask[1, :4] = True, True
    ids[~mask] = 0
    lm.compile(sampler="greedy")
    out = lm.generate(
        {"token_ids": ids, "padding_mask": mask},
        max_length=16,
        stop_token_ids=None,
    )
    tokens = ops.convert_to_numpy(out["token_ids"])
    logits = ops.convert_to_numpy(
        lm({"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)})
    )
    rows, cols = np.nonzero(~mask)
    predicted = logits[rows, cols - 1].argmax(-1)
    return tokens, predicted, tokens[rows, cols]


@pytest.mark.parametrize(
    "attention,options",
    [
        # Softmax's state, the linear state (with and without BN+SH): the
        # ops of Llama's rows in test_llm_conversion.py (`slow_off_torch`;
        # covering, suite, tests/testing.py).
        pytest.param("softmax", {}, marks=slow_off_torch),
        ("bn+sh", {"head_factors": [1, 2, 4, 4]}),
        ("sh", {"head_factors": [2, 2, 4, 8], "num_prefix_tokens": 1}),
        pytest.param("linear", {}, marks=slow_off_torch),
        pytest.param(
            "linear+bn+sh", {"head_factors": [1, 1, 2, 4]}, marks=slow_off_torch
        ),
    ],
)
def test_gpt2_generates_with_the_state_as_teacher_forcing(attention, options):
    new = ksa.replace_attention(_gpt2_lm(), attention, **options)
    layers = [
        layer
        for layer in _attention(new)
        if isinstance(layer, ksa.SVRAttention)
    ]
    assert len(layers) == 2 and all(layer.decode_with_state for layer in layers)
    _, predicted, generated = _generate_and_teacher_force(new)
    np.testing.assert_array_equal(predicted, generated)
    assert len(generated) == 22
    ids = ops.convert_to_tensor(np.ones((2, 64), "int32"))
    cache = new._build_cache(ids)[1]
    kv_cache = _gpt2_lm()._build_cache(ids)[1]
    ratio = math.prod(cache.shape) / math.prod(kv_cache.shape)
    if attention.startswith("linear"):
        # The layers' states: their size does not grow with the tokens.
        assert cache.shape == new._build_cache(ids[:, :8])[1].shape
        assert ratio < 0.2
    elif attention == "softmax":  # keys, values, valid slots, a position
        assert 1 < ratio < 1.05
    else:  # a head pooled by r holds about 1 / r of the slots (and, at
        # key_dim 4, a few sums and flags as large as slots)
        factors = options["head_factors"]
        assert ratio < sum(1 / r for r in factors) / len(factors) + 0.15


@pytest.mark.parametrize("attention", ["linear+bn", "bn+sh"])
def test_gpt2_decoding_with_the_state_survives_keras_save_and_load(
    attention, tmp_path
):
    new = ksa.replace_attention(_gpt2_lm(), attention, beta=0.5)
    tokens = _generate_and_teacher_force(new)[0]
    path = str(tmp_path / "gpt2.keras")
    new.save(path)
    loaded = keras.saving.load_model(path)
    # The class that decodes with the state, and layers that hold it.
    assert type(loaded) is type(new) and type(new).__name__ == "GPT2CausalLM"
    assert type(new) is not type(_gpt2_lm())
    assert all(
        layer.decode_with_state
        for layer in _attention(loaded)
        if isinstance(layer, ksa.SVRAttention)
    )
    np.testing.assert_array_equal(
        _generate_and_teacher_force(loaded)[0], tokens
    )


def _masked_block_model(block, mask_zero=True):
    """ids -> Embedding(mask_zero) -> a KerasHub block: the block's input
    carries a Keras mask, as in KerasHub's own tests of masked inputs."""
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, 16, mask_zero=mask_zero)(ids)
    return keras.Model(ids, block(x))


def _padded_ids():
    ids = np.random.default_rng(5).integers(1, 20, (2, 9)).astype("int32")
    ids[1, 6:] = 0  # right padding
    return ids


@pytest.mark.parametrize("block", ["encoder", "decoder"])
def test_converted_blocks_equal_originals_on_masked_inputs(block):
    # Every row, padded query rows too: with options off the converted
    # block computes what KerasHub's computed (MultiHeadAttention gives a
    # fully masked row the mean of the values; CachedMultiHeadAttention
    # never receives the Keras masks at all).
    layer = {
        "encoder": keras_hub.layers.TransformerEncoder(32, 4),
        "decoder": keras_hub.layers.TransformerDecoder(32, 4),
    }[block]
    model = _masked_block_model(layer)
    random_weights(model, seed=2)
    ids = _padded_ids()
    same = ksa.replace_attention(model, "softmax")
    want = ops.convert_to_numpy(model(ids))
    got = ops.convert_to_numpy(same(ids))
    if block == "encoder":
        # MultiHeadAttention: a padded query row sees no key, and is zero
        # here (docs/guide/rules.md, "Visibility"); the valid rows must agree.
        rows = ids != 0
        want, got = want[rows], got[rows]
    assert_allclose(got, want, 1e-5, 1e-5)
    bnsh = ksa.replace_attention(model, "bn+sh", head_factors=[1, 2, 2, 4])
    changed = ops.convert_to_numpy(bnsh(ids))
    assert np.all(np.isfinite(changed))
    assert np.abs(changed - ops.convert_to_numpy(model(ids))).max() > 1e-4


def _decode(decoder, embedding, ids):
    """Token by token with a cache: `(B, T, F)` outputs."""
    cache = ops.zeros((2, 2, ids.shape[1], 4, 4))
    outputs = []
    for t in range(ids.shape[1]):
        out, cache = decoder(
            embedding(ids[:, t : t + 1]),
            self_attention_cache=cache,
            self_attention_cache_update_index=t,
        )
        outputs.append(ops.convert_to_numpy(out)[:, 0])
    return np.stack(outputs, axis=1)


@pytest.mark.parametrize("attention", ["softmax", "bn+sh"])
def test_converted_decoder_decodes_with_a_cache_on_masked_inputs(attention):
    # The inputs carry a Keras mask (Embedding(mask_zero=True)) throughout.
    ids = _padded_ids()
    original = keras.Sequential(
        [
            keras.layers.Embedding(20, 16, mask_zero=True),
            keras_hub.layers.TransformerDecoder(32, 4),
        ]
    )
    original(ids)
    random_weights(original, seed=4)
    options = {"head_factors": [1, 2, 2, 4]} if attention == "bn+sh" else {}
    new = ksa.replace_attention(original, attention, **options)
    steps = _decode(new.layers[1], new.layers[0], ids)
    valid = ids != 0  # padded steps see no key in KerasHub's own decoding
    if attention == "softmax":
        # Options off: the original's own cached decoding, step by step.
        want = _decode(original.layers[1], original.layers[0], ids)
        assert_allclose(steps[valid], want[valid], 1e-5, 1e-5)
    else:
        # Options on: each step equals the full forward, where no pooled
        # window is cut by the padding (an explicit causal mask, as
        # KerasHub's decoder passes, lets the queries in a window cut by
        # padding see it; decoding cannot know the padding to come).
        ids[1, 6:] = 7
        steps = _decode(new.layers[1], new.layers[0], ids)
        valid = np.ones_like(valid)
    full = ops.convert_to_numpy(new(ids))
    assert_allclose(steps[valid], full[valid], 1e-4, 1e-4)


CONVERTED = {
    "bert": lambda: (*_bert()[:2], "sequence_output", [1, 1, 2, 4], 0),
    "vit": lambda: (*_vit()[:2], None, [1, 1, 2, 4], 1),
    "gpt2": lambda: (
        _gpt2_lm(),
        {
            "token_ids": _padded_ids() % 50,
            "padding_mask": _padded_ids() != 0,
        },
        None,
        [1, 2, 2, 4],
        0,
    ),
}


@pytest.mark.parametrize("name", list(CONVERTED))
def test_converted_models_survive_keras_save_and_load(name, tmp_path):
    model, inputs, key, factors, prefix = CONVERTED[name]()
    random_weights(model, seed=6)
    new = ksa.replace_attention(
        model, "bn+sh", head_factors=factors, num_prefix_tokens=prefix
    )
    path = str(tmp_path / "converted.keras")
    new.save(path)
    loaded = keras.saving.load_model(path)
    assert len(_attention(loaded)) == 2
    for layer in _attention(loaded):
        assert isinstance(layer, ksa.SVRAttention), type(layer)
        assert layer.head_factors == tuple(factors)
    want = ops.convert_to_numpy(_output(new, inputs, key))
    assert_allclose(_output(loaded, inputs, key), want, 1e-5, 1e-5)
    # Saved again after loading: still the conversion.
    loaded.save(path)
    again = keras.saving.load_model(path)
    assert_allclose(_output(again, inputs, key), want, 1e-5, 1e-5)


SAVED = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "data", "converted"
)


@pytest.mark.parametrize("saved_on", ["tensorflow", "jax", "torch"])
@pytest.mark.parametrize("name", list(CONVERTED))
def test_converted_models_load_across_backends(name, saved_on):
    # Files written by tests/scripts/save_converted_models.py on each
    # backend, with the outputs that backend computed.
    path = os.path.join(SAVED, f"{name}-{saved_on}")
    loaded = keras.saving.load_model(path + ".keras")
    data = np.load(path + ".npz")
    inputs = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
    inputs = inputs.get("", inputs) if "" in inputs else inputs
    for layer in _attention(loaded):
        assert isinstance(layer, ksa.SVRAttention), type(layer)
    _, _, key, _, _ = CONVERTED[name]()
    assert_allclose(_output(loaded, inputs, key), data["output"], 1e-4, 1e-4)


def test_a_record_that_names_a_missing_layer_says_so(tmp_path):
    """A `.keras` file whose conversion record names a layer the model
    lacks (edited, or saved from another model) is refused naming the
    recorded path, not with an unpacking error."""
    import json
    import zipfile

    model, _, _, factors, _ = CONVERTED["bert"]()
    new = ksa.replace_attention(model, "bn+sh", head_factors=factors)
    path = str(tmp_path / "converted.keras")
    new.save(path)
    with zipfile.ZipFile(path) as f:
        files = {name: f.read(name) for name in f.namelist()}
    config = json.loads(files["config.json"])
    record = config["config"]["svr_attention_conversion"]["layers"]
    names, _ = record[0]
    names[0] = "no_such_layer"
    files["config.json"] = json.dumps(config).encode()
    edited = str(tmp_path / "edited.keras")
    with zipfile.ZipFile(edited, "w") as f:
        for name, data in files.items():
            f.writestr(name, data)
    with pytest.raises(ValueError, match="does not match the model") as info:
        keras.saving.load_model(edited)
    assert "no_such_layer/" + "/".join(names[1:]) in str(info.value)


def test_a_layer_saved_with_kerashubs_old_flags_loads_as_its_class():
    # Before CachedSVRAttention, KerasHub's calling convention was two
    # options of SVRAttention, saved in every layer's config.
    config = ksa.SVRAttention(num_heads=2, key_dim=4, beta=0.5).get_config()
    assert "use_keras_masks" not in config and "state_cache" not in config
    old = {**config, "use_keras_masks": True, "state_cache": False}
    assert type(ksa.SVRAttention.from_config(old)) is ksa.SVRAttention
    for state in (False, True):
        old = {**config, "use_keras_masks": False, "state_cache": state}
        layer = ksa.SVRAttention.from_config(old)
        assert type(layer).__name__ == "CachedSVRAttention"
        assert layer.decode_with_state is state and layer.beta == 0.5
