"""Which "compute done" a staging slot's next copy may wait on, across eager calls, captures and replays.

CUDA forbids waiting, inside a capture, on an event recorded outside it (or in another capture), and a
graph replay runs no Python, so the event an eager ``compute_done`` recorded says nothing about the
replay's reads of the same slot. Per slot this remembers the context of its last release: an eager
call (``None``), a capture (its id), or "unknown" (never released, or a graph was replayed since).
A copy may wait on the slot's event only when it runs in the context that recorded it; otherwise it
must order itself after everything issued so far on the compute stream (a fork), which covers the
slot's last reader whether that was eager work, a replay, or nothing yet.
"""
from __future__ import annotations

UNKNOWN = object()


class SlotReleases:
    def __init__(self, num_slots: int):
        self._released_in: list[object] = [UNKNOWN] * num_slots

    def released(self, slot: int, capture: int | None) -> None:
        """``compute_done(slot)`` was recorded eagerly (``None``) or inside capture ``capture``."""
        self._released_in[slot] = capture

    def graph_replayed(self) -> None:
        """A graph was launched: its reads of any slot are unknown to the eager events."""
        self._released_in = [UNKNOWN] * len(self._released_in)

    def can_wait_on_event(self, slot: int, capture: int | None) -> bool:
        """True: wait on the slot's "compute done" event; False: fork from the compute stream instead."""
        return self._released_in[slot] is not UNKNOWN and self._released_in[slot] == capture
