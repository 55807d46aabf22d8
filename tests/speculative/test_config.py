"""``--speculative-config``: vLLM's JSON read into settings; every value gh200rt cannot honour refused with what to
write instead."""
import json

import pytest

from gh200rt.cli_args import add_engine_arguments
from gh200rt.config import EngineConfig, SpeculativeConfig, read_speculative_config


def test_vllms_ngram_json_is_read_with_its_defaults():
    m = read_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (m.method, m.num_speculative_tokens, m.prompt_lookup_min, m.prompt_lookup_max) == ("ngram", 3, 5, 5)
    m = read_speculative_config({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert (m.prompt_lookup_min, m.prompt_lookup_max) == (3, 3)        # one bound given: the other follows it
    m = read_speculative_config({"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 2,
                                 "prompt_lookup_max": 4, "disable_by_batch_size": 8})
    assert (m.method, m.prompt_lookup_min, m.prompt_lookup_max, m.disable_by_batch_size) == ("ngram", 2, 4, 8)


def test_a_draft_model_is_named_by_its_path_with_or_without_method():
    m = read_speculative_config({"model": "/models/draft", "num_speculative_tokens": 3})
    assert (m.method, m.model, m.num_speculative_tokens) == ("draft_model", "/models/draft", 3)
    draft = {"method": "draft_model", "model": "d", "num_speculative_tokens": 2}
    assert EngineConfig.from_kwargs(speculative_config=draft, tensor_parallel_size=2).parallel.tensor_parallel_size == 2
    with pytest.raises(ValueError, match="in_place with the draft_model method is not supported yet"):
        EngineConfig.from_kwargs(speculative_config=draft, kv_offloading_size="1", kv_offloading_reads="in_place")


def test_async_scheduling_is_taken_beside_speculation_and_tensor_parallelism():
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    assert EngineConfig.from_kwargs(speculative_config=ngram, async_scheduling=True).scheduler.async_scheduling
    both = EngineConfig.from_kwargs(tensor_parallel_size=2, async_scheduling=True, speculative_config=ngram)
    assert both.scheduler.async_scheduling and both.parallel.tensor_parallel_size == 2
    assert EngineConfig.from_kwargs(speculative_config=ngram).scheduler.async_scheduling is None   # the default
    assert EngineConfig.from_kwargs(speculative_config=ngram, async_scheduling=False).speculative.method is not None


def test_the_flag_and_the_llm_keyword_give_the_same_config():
    import argparse
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    text = '{"method": "ngram", "num_speculative_tokens": 4}'
    args = parser.parse_args(["--speculative-config", text])
    assert args.speculative_config == text
    by_kwargs = EngineConfig.from_kwargs(speculative_config=json.loads(text))
    assert by_kwargs.speculative.method == SpeculativeConfig(text).method


def test_zero_tokens_turns_speculation_off():
    assert SpeculativeConfig('{"method": "ngram", "num_speculative_tokens": 0}').method is None
    assert SpeculativeConfig().method is None


@pytest.mark.parametrize("value, words", [
    ("{not json", "is not JSON"),
    ("[1, 2]", "JSON object"),
    ({"method": "medusa", "num_speculative_tokens": 2}, "unknown method 'medusa'"),
    ({"method": "eagle", "model": "x", "num_speculative_tokens": 2}, "unknown method 'eagle'; choose one of ngram, "
                                                                     "suffix, draft_model, eagle3, mtp"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, "method eagle3 needs \"model\""),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "method draft_model needs \"model\""),
    ({"method": "draft_model", "model": "x", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2},
     "the draft runs unsharded"),
    ({"num_speculative_tokens": 2}, "needs \"method\""),
    ({"method": "ngram"}, "needs num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": -1}, "at least 0, got -1"),
    ({"method": "ngram", "num_speculative_tokens": 2.5}, "must be an integer"),
    ({"method": "ngram", "num_speculative_tokens": "many"}, "must be an integer"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min (4) is larger than prompt_lookup_max (2)"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "at least 1"),
    ({"method": "ngram", "num_speculative_tokens": 2, "speculative_token_tree": "[(0,)]"},
     "speculative_token_tree not supported"),
])
def test_bad_settings_are_refused_with_what_to_do(value, words):
    with pytest.raises(ValueError) as e:
        EngineConfig.from_kwargs(speculative_config=value)
    assert words in str(e.value)


def test_auto_k_chooses_up_to_eight_per_step():
    m = read_speculative_config({"method": "ngram", "num_speculative_tokens": "auto", "prompt_lookup_max": 3})
    assert (m.num_speculative_tokens, m.auto_k) == (8, True)
    assert "k=auto (0-8 per step" in m.describe()
    assert not read_speculative_config({"method": "ngram", "num_speculative_tokens": 4}).auto_k
