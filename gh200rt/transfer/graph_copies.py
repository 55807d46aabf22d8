"""What the staging copies captured into a CUDA graph cost each time the graph is replayed.

A replay runs no Python, so the copies and waits it performs are invisible to the eager counters (the first
GPU run reported 0.24 GB/s of copies for a replayed decode moving ~53 GB/s). While a graph is captured, each
``wait_copy`` files its bytes under the capture and, where timing events can be captured, brackets the wait
with a pair of them: they become event-record nodes, recorded again by every replay. ``captured(graph)``
files the capture's account under the graph; ``replay_starts(graph)`` returns the bytes one replay copies,
and first reads what the previous replay's waits took, before this replay records over them. By then the
engine has read that step's tokens, so those events have completed and reading them does not stall.

A captured event-record node names its event: destroying the event while a graph that records it can still be
replayed makes the replay touch a freed event (on an H100 the second graph of two captured back to back, the
first never filed, crashed in ``replay``). So no pair handed out during a capture is dropped while its graph may
live: a filed graph's pairs return to a spare pool when the graph is collected (and a later capture reuses them);
a capture never filed under a graph (one that raised, or a graph captured without ``captured``) keeps its pairs
for as long as this object lives.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable

TimerPair = tuple[object, object]   # two events with ``elapsed_time`` (ms) and ``synchronize``


@dataclass
class _Account:
    capture: int
    bytes: int = 0
    timers: list[TimerPair] = field(default_factory=list)
    unread: bool = False     # a replay recorded the timers and their times were not added yet


class GraphCopies:
    def __init__(self, timer_pair: Callable[[], TimerPair] | None):
        self._timer_pair = timer_pair           # None: waits inside graphs are not timed
        self._capturing: _Account | None = None
        self._graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._unfiled: list[_Account] = []      # captures no graph was filed for: a graph may still record their events
        self._spare: list[TimerPair] = []       # pairs of collected graphs, free for the next capture
        self.wait_seconds = 0.0

    @property
    def timed(self) -> bool:
        return self._timer_pair is not None

    def waited(self, capture: int, nbytes: int) -> TimerPair | None:
        """A ``wait_copy`` of ``nbytes`` inside capture ``capture``; the events to bracket the wait with."""
        if self._capturing is None or self._capturing.capture != capture:   # a new capture (or a failed one)
            if self._capturing is not None and self._capturing.timers:
                self._unfiled.append(self._capturing)
            self._capturing = _Account(capture)
        self._capturing.bytes += nbytes
        if self._timer_pair is None:
            return None
        pair = self._spare.pop() if self._spare else self._timer_pair()
        self._capturing.timers.append(pair)
        return pair

    def captured(self, graph) -> None:
        """``graph`` is the capture the last ``waited`` calls belonged to (none: it copies nothing)."""
        account = self._capturing or _Account(-1)
        self._graphs[graph] = account
        self._capturing = None
        if account.timers:
            weakref.finalize(graph, self._spare.extend, account.timers)

    def replay_starts(self, graph) -> int:
        """Bytes one replay of ``graph`` copies (0 for a graph never filed)."""
        account = self._graphs.get(graph)
        if account is None:
            return 0
        self._read(account)
        account.unread = bool(account.timers)
        return account.bytes

    def read_all(self) -> float:
        """Wait seconds of every replay so far (blocks until the last replays' events complete)."""
        for account in list(self._graphs.values()):
            self._read(account)
        return self.wait_seconds

    def read_finished(self) -> float:
        """Wait seconds of the replays whose events have all completed; a replay still running (the step launched
        ahead) is read by a later call, without this one waiting for it."""
        for account in list(self._graphs.values()):
            if account.unread and all(end.query() for _, end in account.timers):
                self._read(account)
        return self.wait_seconds

    def _read(self, account: _Account) -> None:
        if not account.unread:
            return
        for start, end in account.timers:
            end.synchronize()
            self.wait_seconds += start.elapsed_time(end) / 1000.0
        account.unread = False
