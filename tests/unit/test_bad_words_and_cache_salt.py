"""vLLM's bad_words (tokenized as vLLM does, banned only after the rest of the word) and the prefix-cache salt
that mixes a request's cache_salt with its LoRA adapter's id."""
from types import SimpleNamespace

import torch

from gh200rt.engine.logits_processors import apply_logits_processors, bad_word_tokens
from gh200rt.kv.kv_manager import salt_of
from gh200rt.sampling_params import SamplingParams

VOCAB = {"ab": [1, 2], " ab": [3, 2], "x": [5], " x": [6, 5], "yz": [7, 8], " yz": [7, 9]}


def test_bad_words_are_tokenized_as_written_and_after_a_space():
    params = SamplingParams(bad_words=["ab", "  x", "yz"]).with_tokenizer(VOCAB.__getitem__)
    # " x" takes two tokens and " yz" starts with the same one: only "ab" gets its spaced form
    assert params.bad_words_token_ids == [[1, 2], [3, 2], [5], [7, 8]]
    assert SamplingParams().with_tokenizer(VOCAB.__getitem__).bad_words_token_ids is None


def seq(words, out):
    return SimpleNamespace(params=SimpleNamespace(bad_words_token_ids=words, allowed_token_ids=None, logit_bias=None),
                           output_token_ids=out, grammar=None)


def test_a_word_is_banned_only_where_the_output_ends_with_its_other_tokens():
    words = [[1, 2], [3, 2], [5], [7, 8, 9]]
    assert bad_word_tokens(seq(words, [])) == [5]
    assert bad_word_tokens(seq(words, [4, 1])) == [2, 5]
    assert bad_word_tokens(seq(words, [3])) == [2, 5]
    assert sorted(bad_word_tokens(seq(words, [7, 8]))) == [5, 9]
    assert bad_word_tokens(seq(words, [8])) == [5]
    logits = torch.zeros(2, 10)
    apply_logits_processors(logits, [seq(words, [1]), seq(None, [1])])
    assert torch.isinf(logits[0, [2, 5]]).all() and torch.isfinite(logits[0, [0, 1, 3, 4, 6, 7, 8, 9]]).all()
    assert torch.isfinite(logits[1]).all()


def test_cache_salt_mixes_with_the_adapter_and_never_equals_an_adapter_id():
    assert salt_of(0, None) == 0 and salt_of(3, None) == 3
    salts = {salt_of(a, s) for a in (0, 1) for s in ("a", "b")}
    assert len(salts) == 4 and all(s >= 1 << 63 for s in salts)
    assert salt_of(1, "a") == salt_of(1, "a")
