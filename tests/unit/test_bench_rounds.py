"""The alternating-rounds timer: every candidate once per round, the order reversed every other round, each one's
results kept in round order."""
from gh200rt.bench.rounds import alternate, seconds_of


def test_candidates_alternate_their_order_and_keep_their_results():
    calls = []

    def candidate(name):
        def measure(r):
            calls.append((r, name))
            return f"{name}{r}"
        return measure
    rounds = []
    results = alternate({"a": candidate("a"), "b": candidate("b"), "c": candidate("c")}, 3, after_round=rounds.append)
    assert calls == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"), (2, "a"), (2, "b"), (2, "c")]
    assert results == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"], "c": ["c0", "c1", "c2"]}
    assert rounds == [0, 1, 2]


def test_seconds_of_returns_the_time_and_the_result():
    seconds, out = seconds_of(lambda: 42)
    assert out == 42 and 0 <= seconds < 1
