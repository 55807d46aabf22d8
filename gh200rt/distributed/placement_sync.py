"""Dynamic tiers under tensor parallelism: rank 0 decides every placement move, the workers repeat it exactly.

Rank 0's tier controller and expert balancer move layers and routed experts between steps through its weight store;
a promotion takes a run of device-arena blocks that rank 0's KV block manager hands out (the run whose blocks no
request holds). A worker has no block manager, so it cannot choose: before each step rank 0 sends, with the step,
every unit (a layer, or one expert of a layer) whose tier or arena run changed since the last step it sent, and
each worker applies those moves before it runs the step, taking exactly rank 0's run in its own arena.

Why the same block ids work on every rank: every rank's arena has rank 0's block count and block bytes (a KV block
of its shard: the same KV heads per rank, whether split or replicated) and a layer's or an expert's shard has the
same bytes on every rank, so the same run lengths (checked at start-up: ``geometry``). A worker's arena holds no
request's blocks (its KV caches are written only at the slots each step names), so its only taken blocks are runs,
which are rank 0's runs as of the last step sent; demotions applied first leave exactly the blocks rank 0's
promotions took free.

The moves are a diff of placements, not a log of calls, so a unit moved twice between two steps (a swap that
demotes and promotes, a layer out and back in) travels once, as its end state.
"""
from __future__ import annotations

from dataclasses import dataclass

from gh200rt.weights.tiers import Tier

TIERS = list(Tier)
NO_EXPERT = NO_RUN = -1


@dataclass(frozen=True)
class PlacementMove:
    layer: int
    expert: int          # NO_EXPERT: the layer itself
    tier: Tier
    run_start: int       # the first arena block rank 0's promotion took (NO_RUN: not in the arena)

    def encode(self) -> list[int]:
        return [self.layer, self.expert, TIERS.index(self.tier), self.run_start]

    @classmethod
    def decode(cls, values: list[int]) -> list["PlacementMove"]:
        return [cls(values[k], values[k + 1], TIERS[values[k + 2]], values[k + 3]) for k in range(0, len(values), 4)]


# unit (layer, expert or NO_EXPERT) -> (tier, first block of its arena run or NO_RUN)
Placement = dict[tuple[int, int], tuple[Tier, int]]


def placement(store) -> Placement:
    runs, expert_runs = store._runs, store._expert_runs
    out = {(layer, NO_EXPERT): (tier, runs.get(layer, NO_RUN)) for layer, tier in enumerate(store.tiers)}
    for layer, tiers in store.expert_tiers.items():
        for expert, tier in enumerate(tiers):
            out[(layer, expert)] = (tier, expert_runs.get((layer, expert), NO_RUN))
    return out


def moves_between(before: Placement, after: Placement) -> list[PlacementMove]:
    """What turns ``before`` into ``after``: every move out of the arena (or between offloaded tiers) first, then
    every move into it at its run. A unit that is resident in both at another run leaves (read in place) and
    comes back."""
    leave, enter = [], []
    for unit, (tier, start) in after.items():
        old_tier, old_start = before[unit]
        if (tier, start) == (old_tier, old_start):
            continue
        if tier == Tier.RESIDENT:
            if old_tier == Tier.RESIDENT:
                leave.append(PlacementMove(*unit, Tier.DIRECT, NO_RUN))
            enter.append(PlacementMove(*unit, tier, start))
        else:
            leave.append(PlacementMove(*unit, tier, NO_RUN))
    return leave + enter


class PlacementTracker:
    """Rank 0: the moves its store made since the last step it sent."""

    def __init__(self, store):
        self.store = store
        self.sent = placement(store)

    def moves(self) -> list[PlacementMove]:
        now = placement(self.store)
        moves = moves_between(self.sent, now)
        self.sent = now
        return moves


def apply_moves(store, moves: list[PlacementMove]) -> None:
    """A worker: make each move in its store, a promotion at rank 0's run (asserted)."""
    for move in moves:
        if move.expert == NO_EXPERT:
            def make(m=move):
                store.set_tier(m.layer, m.tier)
        else:
            def make(m=move):
                store.set_expert_tier(m.layer, m.expert, m.tier)
        if move.run_start == NO_RUN:
            make()
            continue
        with store.arena.taking_at(move.run_start):
            make()
    if moves:
        got, last = placement(store), {(m.layer, m.expert): m for m in moves}
        for unit, move in last.items():
            assert got[unit] == (move.tier, move.run_start), (move, got[unit])


def geometry(store) -> dict:
    """What must be equal on every rank for rank 0's block ids to mean the same runs everywhere."""
    arena = store.arena
    if arena is None:
        return {}
    return {"num_blocks": arena.num_blocks, "block_bytes": arena.block_bytes,
            "layer_run_blocks": store.layer_run_blocks, "expert_run_blocks": store.expert_run_blocks,
            "runs": [list(run) for run in sorted(arena.pool.runs.items())]}
