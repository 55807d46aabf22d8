"""What the staging copies captured into a CUDA graph cost each time the graph is replayed.

A replay runs no Python, so the copies and waits it performs are invisible to the eager counters (the first
GPU run reported 0.24 GB/s of copies for a replayed decode moving ~53 GB/s). While a graph is captured, each
``wait_copy`` files its bytes under the capture and, where timing events can be captured, brackets the wait
with a pair of them: they become event-record nodes, recorded again by every replay. ``captured(graph)``
files the capture's account under the graph; ``replay_starts(graph)`` returns the bytes one replay copies,
and first reads what the previous replay's waits took, before this replay records over them. By then the
engine has read that step's tokens, so those events have completed and reading them does not stall.
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
        self.wait_seconds = 0.0

    @property
    def timed(self) -> bool:
        return self._timer_pair is not None

    def waited(self, capture: int, nbytes: int) -> TimerPair | None:
        """A ``wait_copy`` of ``nbytes`` inside capture ``capture``; the events to bracket the wait with."""
        if self._capturing is None or self._capturing.capture != capture:   # a new capture (or a failed one)
            self._capturing = _Account(capture)
        self._capturing.bytes += nbytes
        if self._timer_pair is None:
            return None
        pair = self._timer_pair()
        self._capturing.timers.append(pair)
        return pair

    def captured(self, graph) -> None:
        """``graph`` is the capture the last ``waited`` calls belonged to (none: it copies nothing)."""
        self._graphs[graph] = self._capturing or _Account(-1)
        self._capturing = None

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

    def _read(self, account: _Account) -> None:
        if not account.unread:
            return
        for start, end in account.timers:
            end.synchronize()
            self.wait_seconds += start.elapsed_time(end) / 1000.0
        account.unread = False
