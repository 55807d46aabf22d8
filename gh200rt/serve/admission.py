"""Admission: how many sequences the server holds at once, and a fast 503 for the rest.

A generation request is admitted before it is tokenized, for one slot per sequence it will run (its
prompts times ``n``, as vLLM's ``--max-num-queued-reqs`` counts), and holds its slots until its run
closes: finished, aborted, failed, or its client gone. A request whose slots would pass the limit is
refused at once: 503, a ``Retry-After`` header and an OpenAI error body naming the limit and the flags
that raise it. Nothing of a refused request reaches the tokenizer or the engine, so overload costs
the server no more than reading the body; streamed and plain requests, chat and completions alike,
are refused before any byte of a response.

The limit is ``--max-num-seqs + --max-queued-requests`` (SGLang's name), or vLLM's
``--max-num-queued-reqs`` (running and waiting together) when that is given.

``Retry-After`` is measured, not a constant: the seconds the sequences now waiting beyond the running
ones (at least the slots asked for) take to drain at the rate slots were released over the last
``RATE_WINDOW_SECONDS`` of the current busy period (since the server last held nothing), rounded up and
kept within [1, ``MAX_RETRY_AFTER_SECONDS``]. Before any slot was released in that window there is
nothing to measure, and it is ``UNMEASURED_RETRY_AFTER_SECONDS`` (1 s).

Everything here runs on the event loop, so it needs no lock.
"""
from __future__ import annotations

import math
import time
from collections import deque

from gh200rt.serve.errors import APIError, bad_request

RATE_WINDOW_SECONDS = 30.0
MAX_RETRY_AFTER_SECONDS = 60
UNMEASURED_RETRY_AFTER_SECONDS = 1


class Ticket:
    """The slots one admitted request holds; ``release()`` gives them back once (idempotent)."""

    def __init__(self, admission: Admission, slots: int):
        self._admission = admission
        self.slots = slots

    def release(self) -> None:
        if self.slots:
            self._admission._release(self.slots)
            self._admission.requests -= 1
            self.slots = 0


class Admission:
    def __init__(self, limit: int, running: int, flags: str, raise_flag: str, clock=time.monotonic):
        """``limit``: sequences held at once; ``running``: --max-num-seqs, the ones that run while the rest
        wait; ``flags``: how the limit was set (e.g. "--max-num-seqs 4 + --max-queued-requests 16") and
        ``raise_flag`` the flag that raises it, for messages."""
        assert limit >= 1 and running >= 1, (limit, running)
        self.limit = limit
        self.running = running
        self.flags = flags
        self.raise_flag = raise_flag
        self.held = 0
        self.requests = 0                        # admitted requests holding slots: GET /load's server_load
        self.refused = 0                         # requests refused for overload since start
        self._clock = clock
        self._released: deque[tuple[float, int]] = deque()   # (time, slots) within the rate window
        self._busy_since: float | None = None

    def admit(self, slots: int, param: str = "n") -> Ticket:
        """Hold ``slots`` or raise: 400 (naming ``param``) if they can never fit, 503 with Retry-After while
        the server is full."""
        if slots > self.limit:
            raise bad_request(f"the request runs {slots} sequences (prompts x n); this server holds at most "
                              f"{self.limit} at once ({self.flags}); send fewer prompts or a smaller n", param)
        if self.held + slots > self.limit:
            self.refused += 1
            wait = self.retry_after(slots)
            raise APIError(503, f"the server is full: {self.held} sequences are queued or running and the limit is "
                                f"{self.limit} ({self.flags}); retry after {wait} s ({self._rate_text()}), or "
                                f"raise {self.raise_flag}",
                           code="server_overloaded", headers={"Retry-After": str(wait)})
        if self.held == 0:                       # busy again: the rate is measured within this busy period
            self._busy_since = self._clock()
            self._released.clear()
        self.held += slots
        self.requests += 1
        return Ticket(self, slots)

    def _release(self, slots: int) -> None:
        assert 0 < slots <= self.held, (slots, self.held)
        self.held -= slots
        now = self._clock()
        self._released.append((now, slots))
        self._forget(now)

    def _forget(self, now: float) -> None:
        while self._released and self._released[0][0] < now - RATE_WINDOW_SECONDS:
            self._released.popleft()

    def drain_rate(self) -> float | None:
        """Slots released per second over the last RATE_WINDOW_SECONDS of this busy period; None before any."""
        now = self._clock()
        self._forget(now)
        if not self._released:
            return None
        assert self._busy_since is not None
        start = max(now - RATE_WINDOW_SECONDS, self._busy_since)
        return sum(slots for _, slots in self._released) / max(now - start, 1.0)

    def retry_after(self, slots: int = 1) -> int:
        rate = self.drain_rate()
        if rate is None:
            return UNMEASURED_RETRY_AFTER_SECONDS
        backlog = max(self.held - self.running, slots)
        return min(MAX_RETRY_AFTER_SECONDS, max(1, math.ceil(backlog / rate)))

    def _rate_text(self) -> str:
        rate = self.drain_rate()
        if rate is None:
            return f"no sequence finished in the last {RATE_WINDOW_SECONDS:.0f} s to measure how fast it drains"
        return f"sequences leave at {rate:.2f}/s"
