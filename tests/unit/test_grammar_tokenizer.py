"""Structured outputs on a tokenizer the grammar engine cannot read: an error that says what about the
tokenizer is unsupported and what to do (the first GPU run got llguidance's "can't determine decoder type:
None" from a word-level tokenizer), and a byte-level tokenizer of the same vocabulary works."""
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from gh200rt.structured import Constraint
from gh200rt.structured.matchers import GrammarMatchers
from gh200rt.tokenizer.tokenizer import Tokenizer

VOCAB = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 40)}}


def word_level(decoder=None) -> Tokenizer:
    backend = Backend(models.WordLevel(VOCAB, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if decoder is not None:
        backend.decoder = decoder
    return Tokenizer(backend, bos_token="<s>", eos_token="</s>")


def test_a_tokenizer_without_a_decoder_is_refused_in_words_a_user_can_act_on():
    matchers = GrammarMatchers(word_level(), len(VOCAB), {2})
    with pytest.raises(ValueError) as err:
        matchers.new(Constraint.json_schema({"type": "object"}))
    message = str(err.value)
    assert "tokenizer.json has no decoder (a WordLevel tokenizer)" in message
    assert "without the constraint" in message and "can't determine decoder type" not in message


def test_the_same_vocabulary_with_a_byte_level_decoder_compiles_a_grammar():
    matchers = GrammarMatchers(word_level(decoders.ByteLevel()), len(VOCAB), {2})
    assert not matchers.new(Constraint.choice(["w3", "w4"])).failed
