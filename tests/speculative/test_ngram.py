"""Prompt lookup: the tokens after the latest earlier occurrence of the longest matching suffix, against a plain
Python reference over random token lists."""
import random

import numpy as np

from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence
from gh200rt.speculative.ngram import NgramProposer, TokenHistory, lookup_draft
from gh200rt.speculative.speculator import draft_room


def reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):      # latest first, with a token after it
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_lookup_matches_the_reference():
    rng = random.Random(0)
    for _ in range(400):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        low = rng.randrange(1, 4)
        high = low + rng.randrange(0, 3)
        k = rng.randrange(1, 6)
        assert lookup_draft(np.array(tokens), low, high, k) == reference(tokens, low, high, k), (tokens, low, high)


def test_longest_suffix_wins_over_a_later_shorter_one():
    tokens = [1, 2, 3, 9, 9, 5, 3, 7, 1, 2, 3]
    assert lookup_draft(np.array(tokens), 1, 3, 2) == [9, 9]        # [1, 2, 3] at 0, not [3] at 6
    assert lookup_draft(np.array(tokens), 1, 1, 2) == [7, 1]        # only one-token suffixes: the latest [3]
    assert lookup_draft(np.array([5, 6, 7]), 1, 3, 4) == []


def test_history_follows_a_growing_list_and_a_new_one():
    history, tokens = TokenHistory(), list(range(10))
    assert history.sync(tokens).tolist() == tokens
    tokens += list(range(100))
    assert history.sync(tokens).tolist() == tokens                  # grown past its first capacity
    assert history.sync([7, 8]).tolist() == [7, 8]                  # a shorter list is a new one


def test_drafts_never_exceed_what_the_sequence_may_still_produce():
    seq = Sequence("s#0", "s", 0, [1, 2, 1, 2, 1, 2], SamplingParams(max_tokens=3), arrival=0, max_model_len=10)
    assert draft_room(seq, 8) == 2                                  # 3 tokens left: 2 drafted + 1 of its own
    seq.append_token(1)
    seq.append_token(2)
    assert draft_room(seq, 8) == 0
    long = Sequence("l#0", "l", 0, [1, 2] * 4, SamplingParams(max_tokens=100), arrival=0, max_model_len=10)
    assert draft_room(long, 8) == 1                                 # the context holds two more tokens
    proposer = NgramProposer(1, 2)
    assert proposer.propose(long, 1) == [1]


def test_the_speculator_keeps_histories_of_running_sequences_only():
    from gh200rt.config import read_speculative_config
    from gh200rt.speculative.speculator import Speculator
    speculator = Speculator(read_speculative_config({"method": "ngram", "num_speculative_tokens": 2,
                                                   "prompt_lookup_min": 1, "prompt_lookup_max": 3}))
    params = SamplingParams(max_tokens=8)
    running = [Sequence(f"s{i}#0", f"s{i}", 0, [1, 2, 3, 1, 2, 3], params, arrival=i) for i in range(40)]
    for seq in running:
        seq.num_computed_tokens = seq.num_tokens - 1
    speculator.propose(running)
    assert all(seq.spec_drafts for seq in running)
    speculator.propose(running[:2])
    assert speculator.lookup.num_histories == 2
