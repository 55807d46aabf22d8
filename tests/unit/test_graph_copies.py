"""Copies captured into a graph count on every replay (graph_copies.py), with fake timing events: bytes per
replay, waits read back before the next replay records over them, a failed capture's waits not counted, and
no captured event dropped while a graph may still record it."""
from gh200rt.transfer.graph_copies import GraphCopies


class FakeEvent:
    def __init__(self, clock):
        self.clock, self.at, self.synced = clock, None, 0
        self.done = True          # False: the device has not reached the event yet (a step in flight)

    def query(self) -> bool:
        return self.done

    def record(self):
        self.at = self.clock[0]

    def synchronize(self):
        self.synced += 1

    def elapsed_time(self, end) -> float:
        return end.at - self.at       # ms


class Graph:
    """Stands in for a CUDAGraph: replaying records its captured events at the clock's times."""

    def __init__(self, pairs, clock, wait_ms):
        self.pairs, self.clock, self.wait_ms = pairs, clock, wait_ms

    def replay(self):
        for start, end in self.pairs:
            start.record()
            self.clock[0] += self.wait_ms
            end.record()


def test_each_replay_counts_its_captured_bytes_and_waits():
    clock = [0.0]
    copies = GraphCopies(lambda: (FakeEvent(clock), FakeEvent(clock)))
    pairs = [copies.waited(capture=7, nbytes=1000), copies.waited(capture=7, nbytes=500)]
    graph = Graph(pairs, clock, wait_ms=2.0)
    copies.captured(graph)
    assert copies.replay_starts(graph) == 1500
    graph.replay()
    assert copies.replay_starts(graph) == 1500       # reads the first replay's two waits before the second
    assert copies.wait_seconds == 0.004
    graph.replay()
    assert copies.read_all() == 0.008 and copies.read_all() == 0.008   # each replay read once


def test_a_failed_capture_is_not_filed_under_the_next_graph_and_unknown_graphs_copy_nothing():
    copies = GraphCopies(None)                       # no timing events inside graphs on this host
    assert copies.waited(capture=1, nbytes=4096) is None    # a capture that raised before it was filed
    copies.waited(capture=2, nbytes=100)
    graph = Graph([], [0.0], 0.0)
    copies.captured(graph)
    assert copies.replay_starts(graph) == 100
    other = Graph([], [0.0], 0.0)
    copies.captured(other)                           # captured without a streamed layer
    assert copies.replay_starts(other) == 0 and copies.replay_starts(Graph([], [0.0], 0.0)) == 0
    assert copies.read_all() == 0.0


def test_captured_events_live_as_long_as_a_graph_may_replay_them():
    """A graph's event-record nodes name their events: a capture never filed (here: the first of two back to back)
    keeps its pairs; a filed graph's pairs outlive it only to be reused by the next capture."""
    import gc
    import weakref
    clock, made = [0.0], []

    def pair():
        made.append((FakeEvent(clock), FakeEvent(clock)))
        return made[-1]

    copies = GraphCopies(pair)
    first = [copies.waited(capture=1, nbytes=10)]           # captured, never filed
    alive = [weakref.ref(event) for event in first[0]]
    del first
    second = Graph([copies.waited(capture=2, nbytes=10)], clock, 1.0)
    made.clear()
    gc.collect()
    assert all(ref() is not None for ref in alive), "an unfiled capture's events were dropped"
    copies.captured(second)
    second_pairs = list(second.pairs)
    del second
    gc.collect()
    reused = copies.waited(capture=3, nbytes=10)
    assert reused is second_pairs[0] and not made, "a collected graph's events were not reused"


def test_reading_finished_waits_skips_a_replay_still_running():
    """Between steps the tier controller reads only the replays the device has finished: with async scheduling the
    step launched ahead is still running, and reading its events would block until it is done."""
    clock = [0.0]
    copies = GraphCopies(lambda: (FakeEvent(clock), FakeEvent(clock)))
    pairs = [copies.waited(capture=1, nbytes=10), copies.waited(capture=1, nbytes=10)]
    graph = Graph(pairs, clock, wait_ms=3.0)
    copies.captured(graph)
    copies.replay_starts(graph)
    graph.replay()
    pairs[1][1].done = False                                    # its last wait has not run yet
    assert copies.read_finished() == 0.0
    assert all(end.synced == 0 for _, end in pairs), "nothing waited on"
    pairs[1][1].done = True
    assert copies.read_finished() == 0.006 and copies.read_all() == 0.006   # read once
