"""KerasHub tasks converted as `from_preset` returns them: preprocessor
attached (issue 37). Tiny tasks with their own tokenizers from small
in-memory vocabularies (a BPE vocabulary and merges, a SentencePiece model
trained in memory), as KerasHub's own tests build them; no preset download.
On JAX and torch, KerasHub preprocesses through `grain` (noxfile); on
TensorFlow, a text task's `predict` needs tensorflow-text, which the
original needs too (the test skips with KerasHub's error).

Options off ("softmax"), the converted task computes what the original
does from strings and images; BN+SH generates from a string, and the
converted task keeps doing so through `.keras` saving.
"""

import io
import os

import keras
import numpy as np
import pytest

import keras_svr_attention as ksa
from tests.convert import test_llm_conversion as llm_zoo
from tests.testing import random_weights
from tests.testing import slow_off_torch

keras_hub = pytest.importorskip("keras_hub")
models = keras_hub.models

PROMPT = " the quick brown fox"
WORDS = "the quick brown fox jumped over a lazy dog and ran to its home".split()


def _bpe(cls, specials=("<|endoftext|>",), words=WORDS):
    """A byte-pair tokenizer of `cls` (GPT-2's byte-level BPE): the
    family's special tokens, every character of WORDS and "Ġ" (a leading
    space), and one merge per word, pair by pair."""
    merges, vocabulary = [], [*specials, "Ġ"]
    for word in words:
        pieces = ["Ġ"] + list(word)
        for piece in pieces:
            if piece not in vocabulary:
                vocabulary.append(piece)
        while len(pieces) > 1:
            merge = f"{pieces[0]} {pieces[1]}"
            pieces = [pieces[0] + pieces[1]] + pieces[2:]
            if merge not in merges:
                merges.append(merge)
                vocabulary.append(pieces[0])
    vocabulary = {token: i for i, token in enumerate(vocabulary)}
    return cls(vocabulary=vocabulary, merges=merges)


def _sentencepiece(cls, specials):
    """A SentencePiece tokenizer of `cls`, its model trained in memory on
    WORDS with the family's special pieces (pad, bos, eos, unk)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    proto = io.BytesIO()
    pad, bos, eos, unk = specials
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([" ".join(WORDS)] * 4),
        model_writer=proto,
        vocab_size=len(WORDS) + 4,
        model_type="WORD",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3,
        pad_piece=pad, bos_piece=bos, eos_piece=eos, unk_piece=unk,
    )  # fmt: skip
    return cls(proto=proto.getvalue())


def _causal_lm(family):
    """(task, its backbone's head count) with preprocessor attached."""
    if family == "gpt2":
        tokenizer = _bpe(models.GPT2Tokenizer)
        backbone = models.GPT2Backbone(
            vocabulary_size=tokenizer.vocabulary_size(), num_layers=2,
            num_heads=2, hidden_dim=8, intermediate_dim=16,
            max_sequence_length=16,
        )  # fmt: skip
        task, preprocessor = (
            models.GPT2CausalLM,
            models.GPT2CausalLMPreprocessor,
        )
    elif family == "llama":
        tokenizer = _sentencepiece(
            models.LlamaTokenizer, ("<pad>", "<s>", "</s>", "<unk>")
        )
        backbone = models.LlamaBackbone(
            vocabulary_size=tokenizer.vocabulary_size(), num_layers=2,
            num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
            intermediate_dim=16,
        )  # fmt: skip
        task = models.LlamaCausalLM
        preprocessor = models.LlamaCausalLMPreprocessor
    else:
        tokenizer = _sentencepiece(
            models.GemmaTokenizer, ("<pad>", "<bos>", "<eos>", "<unk>")
        )
        backbone = models.GemmaBackbone(
            vocabulary_size=tokenizer.vocabulary_size(), num_layers=2,
            num_query_heads=4, num_key_value_heads=2, hidden_dim=8,
            intermediate_dim=16, head_dim=4,
        )  # fmt: skip
        task = models.GemmaCausalLM
        preprocessor = models.GemmaCausalLMPreprocessor
    random_weights(backbone, seed=1)
    lm = task(
        backbone=backbone,
        preprocessor=preprocessor(tokenizer=tokenizer, sequence_length=12),
    )
    lm.compile(sampler="greedy")
    return lm


def _svr_layers(model):
    return [
        layer
        for layer in model._flatten_layers()
        if isinstance(layer, ksa.SVRAttention)
        or "HookedAttention" in [c.__name__ for c in type(layer).__mro__]
    ]


def _generate(lm, prompt):
    """Greedy, to the full length: random weights often pick the end
    token first, and a text that stops there would compare nothing."""
    return lm.generate(prompt, max_length=10, stop_token_ids=None)


# GPT-2's and Gemma's tasks repeat Llama's path through the preprocessor
# and `generate` with their own tokenizers (`slow_off_torch`).
@pytest.mark.parametrize(
    "family",
    [
        pytest.param("gpt2", marks=slow_off_torch),
        "llama",
        pytest.param("gemma", marks=slow_off_torch),
    ],
)
def test_causal_lm_with_its_preprocessor_converts_and_generates(
    family, tmp_path
):
    lm = _causal_lm(family)
    want = _generate(lm, PROMPT)
    assert isinstance(want, str) and len(want) > len(PROMPT.strip())

    same = ksa.replace_attention(lm, "softmax")
    same.compile(sampler="greedy")
    assert same.preprocessor is lm.preprocessor
    assert len(_svr_layers(same)) == 2
    assert _generate(same, PROMPT) == want

    converted = ksa.replace_attention(lm, "bn+sh", head_factors=[1, 2])
    converted.compile(sampler="greedy")
    assert len(_svr_layers(converted)) == 2
    text = _generate(converted, PROMPT)
    assert isinstance(text, str)
    assert _generate(converted, [PROMPT, " a lazy dog"])[0] == text
    # Saved with its preprocessor's assets, loaded as a task that generates
    # the same text.
    path = os.path.join(tmp_path, "lm.keras")
    converted.save(path)
    loaded = keras.saving.load_model(path)
    loaded.compile(sampler="greedy")
    assert len(_svr_layers(loaded)) == 2
    assert _generate(loaded, PROMPT) == text
    # The original is unchanged.
    assert not _svr_layers(lm)
    assert _generate(lm, PROMPT) == want


def _text_classifier():
    """RoBERTa's: a BPE tokenizer, which KerasHub runs on every backend
    without tensorflow-text (BERT's WordPiece needs it on TensorFlow)."""
    specials = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
    tokenizer = _bpe(models.RobertaTokenizer, specials)
    backbone = models.RobertaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), num_layers=2,
        num_heads=4, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=12, dropout=0.0,
    )  # fmt: skip
    preprocessor = models.RobertaTextClassifierPreprocessor(
        tokenizer=tokenizer, sequence_length=12
    )
    task = models.RobertaTextClassifier(
        backbone, num_classes=3, preprocessor=preprocessor, dropout=0.0
    )
    return task, [PROMPT, " a lazy dog ran home"], [1, 1, 2, 4]


def _image_classifier():
    backbone = models.ViTBackbone(
        image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=4,
        hidden_dim=16, mlp_dim=32,
    )  # fmt: skip
    converter = keras_hub.layers.ViTImageConverter(
        image_size=(16, 16), scale=1 / 255.0
    )
    preprocessor = models.ViTImageClassifierPreprocessor(converter)
    task = models.ViTImageClassifier(
        backbone, num_classes=3, preprocessor=preprocessor
    )
    images = np.random.default_rng(0).integers(0, 256, (2, 20, 20, 3))
    return task, images.astype("float32"), [1, 1, 2, 4]


@pytest.mark.parametrize(
    "build", [_text_classifier, _image_classifier], ids=["text", "image"]
)
def test_classifier_with_its_preprocessor_converts_and_predicts(
    build, tmp_path
):
    task, raw, factors = build()
    random_weights(task, seed=2)
    try:
        want = task.predict(raw, verbose=0)
    except Exception as error:  # KerasHub's own task, on tf.data
        if "tensorflow-text" not in str(error):
            raise
        pytest.skip("KerasHub's task needs tensorflow-text on TensorFlow")
    same = ksa.replace_attention(task, "softmax")
    assert same.preprocessor is task.preprocessor
    np.testing.assert_allclose(same.predict(raw, verbose=0), want, atol=1e-5)
    prefix = {"num_prefix_tokens": 1}  # the CLS token is never pooled
    converted = ksa.replace_attention(
        task, "bn+sh", head_factors=factors, **prefix
    )
    got = converted.predict(raw, verbose=0)
    assert np.all(np.isfinite(got)) and not np.allclose(got, want)
    path = os.path.join(tmp_path, "task.keras")
    converted.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(raw, verbose=0), got, atol=1e-5)


# Each family's conversion with a preprocessor attached is Python-level;
# the three tasks above generate on every backend (JAX and TensorFlow
# compile each family's generate loop anew).
@slow_off_torch
@pytest.mark.parametrize("family", llm_zoo.FAMILIES)
def test_every_zoo_family_converts_with_a_preprocessor_attached(family):
    """Each decoder family of the zoo, its task holding a preprocessor (a
    tiny BPE one: what matters here is that one is attached), converts to
    BN+SH and generates from a string. Its numbers: test_llm_conversion."""
    lm = llm_zoo._llama(family)
    tokenizer = _bpe(models.GPT2Tokenizer, words=("the", "fox"))
    assert tokenizer.vocabulary_size() <= lm.backbone.vocabulary_size
    preprocessor = models.CausalLMPreprocessor(tokenizer, sequence_length=12)
    lm = type(lm)(backbone=lm.backbone, preprocessor=preprocessor)
    factors = [1, 1, 2, 2] if family == "neox" else [1, 2]
    converted = ksa.replace_attention(lm, "bn+sh", head_factors=factors)
    converted.compile(sampler="greedy")
    assert converted.preprocessor is preprocessor
    assert not _svr_layers(lm)
    hooked = {id(layer) for layer in _svr_layers(converted)}
    assert hooked == {id(x) for x in llm_zoo._attention_layers(converted)}
    text = _generate(converted, " the fox")
    assert isinstance(text, str) and text.startswith(" the fox")
