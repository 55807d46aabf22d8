"""The suffix method: trees count every path of up to max_depth tokens; a draft follows the longest match's most
frequent continuation while each token keeps enough of its parent's occurrences, for at most max_spec_factor x the
match's length; the global tree keeps the latest finished outputs only; and in the engine a request that repeats an
earlier one's answer drafts it from the global tree (n-gram lookup cannot see it), with greedy output unchanged."""
from __future__ import annotations

import pytest

from gh200rt.config import read_speculative_config
from gh200rt.sampling_params import SamplingParams
from gh200rt.speculative.suffix import SuffixProposer, SuffixTree
from tests.speculative.test_spec_engine import same, tiny, tiny_path  # noqa: F401


def test_paths_are_counted_and_uncounted():
    tree = SuffixTree(3)
    tree.add([1, 2, 3, 1, 2, 4])
    node, length = tree.match([9, 1, 2])
    assert length == 2 and {t: c.count for t, c in node.children.items()} == {3: 1, 4: 1}
    tree.add([1, 2, 3, 1, 2, 4], delta=-1)
    assert tree.root.children == {} and tree.root.count == 0


@pytest.mark.parametrize("depth", [3, 6, 24])
def test_a_requests_history_drafts_what_a_tree_over_it_drafts(depth):
    """TokenHistory counts the tree's paths on demand: for token lists that repeat themselves (a small vocabulary, and
    copies of earlier runs), grown in pieces, its draft and score are the tree's over the same tokens."""
    import random

    from gh200rt.speculative.suffix import TokenHistory
    rng = random.Random(depth)
    for trial in range(60):
        tokens = [rng.randrange(2 + trial % 7) for _ in range(rng.randint(1, 30))]
        while len(tokens) < 120:
            start = rng.randrange(len(tokens))
            tokens += tokens[start:start + rng.randint(1, 12)] + [rng.randrange(9)] * rng.randint(0, 2)
        history = TokenHistory(depth)
        for end in sorted(rng.sample(range(1, len(tokens)), 8)) + [len(tokens)]:
            history.extend(tokens[history.size:end])
            tree = SuffixTree(depth)
            tree.add(tokens[:end])
            for k, factor, p in ((8, 1.0, 0.1), (4, 2.0, 0.3), (16, 4.0, 0.0)):
                want = tree.draft(tokens[:end][-depth:], k, factor, p)
                got = history.draft(k, factor, p)
                assert got[0] == want[0] and got[1] == pytest.approx(want[1]), (tokens[:end], k, factor, p)


def test_a_draft_follows_the_most_frequent_continuation_while_it_is_likely_enough():
    tree = SuffixTree(8)
    for _ in range(3):
        tree.add([1, 2, 3, 4, 5, 6])
    tree.add([1, 2, 3, 9])
    tokens, score = tree.draft([7, 1, 2, 3], k=8, max_spec_factor=1.0, min_token_prob=0.1)
    assert tokens == [4, 5, 6][:3] and score == pytest.approx(0.75 * 3)     # 3 of 4 occurrences go on with 4
    assert tree.draft([7, 1, 2, 3], k=8, max_spec_factor=1.0, min_token_prob=0.8)[0] == []   # 0.75 < 0.8
    assert tree.draft([2, 3], k=8, max_spec_factor=1.0, min_token_prob=0.1)[0] == [4, 5]      # 2 matched: 2 drafted
    assert tree.draft([1, 2, 3], k=1, max_spec_factor=4.0, min_token_prob=0.1)[0] == [4]      # k bounds it


def test_the_global_tree_keeps_the_latest_outputs_only():
    proposer = SuffixProposer(max_depth=6, max_cached_requests=2, max_spec_factor=2.0, min_token_prob=0.1)
    for output in ([10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]):
        proposer.finished(output)
    assert proposer.global_tree.draft([30, 31], 4, 2.0, 0.1)[0] == [32, 33]
    assert proposer.global_tree.draft([10, 11], 4, 2.0, 0.1)[0] == []      # the oldest left


def test_suffix_settings_are_read_and_refused_where_they_do_not_apply():
    m = read_speculative_config({"method": "suffix", "suffix_decoding_max_tree_depth": 16,
                                 "suffix_decoding_min_token_prob": 0.2})
    assert (m.num_speculative_tokens, m.suffix_max_tree_depth, m.suffix_min_token_prob) == (16, 16, 0.2)
    assert m.suffix_max_cached_requests == 10000 and "suffix, k=16, trees 16 tokens deep" in m.describe()
    for bad, words in (({"method": "ngram", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8},
                        "set the suffix method's trees"),
                       ({"method": "suffix", "prompt_lookup_max": 3}, "set prompt lookup (method ngram)"),
                       ({"method": "suffix", "suffix_decoding_min_token_prob": 1.5}, "between 0.0 and 1.0"),
                       ({"method": "suffix", "model": "x"}, "drop \"model\"")):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            read_speculative_config(bad)


def test_a_repeated_request_drafts_the_earlier_answer_from_the_global_tree(tiny):  # noqa: F811
    prompt = [17, 203, 45, 99, 150, 8, 77, 31, 250, 12]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    options = {"batch_invariant": True, "max_model_len": 128, "num_kv_blocks": 64, "enable_prefix_caching": False}
    want = tiny.llm(**options).generate([prompt], params)
    accepted = {}
    for method, extra in (("ngram", {"prompt_lookup_min": 2, "prompt_lookup_max": 4}), ("suffix", {})):
        llm = tiny.llm(speculative_config={"method": method, "num_speculative_tokens": 6, **extra}, **options)
        same(want, llm.generate([prompt], params))
        before = llm.engine.stats().spec_decode.num_accepted_tokens
        same(want, llm.generate([prompt], params))          # the same request again: an agent's repeated step
        accepted[method] = llm.engine.stats().spec_decode.num_accepted_tokens - before
    assert accepted["suffix"] >= 16 and accepted["suffix"] > 2 * accepted["ngram"], accepted   # of 31 positions
