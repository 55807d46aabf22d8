"""Scenarios of the decode graphs' memory pool, each run in a fresh process by test_gpu_graph_pool.py.

A fresh process matters: the allocator's graph pools outlive the tests that made them, and the failure
these guard against (the allocator's ``use_count > 0`` assertion) aborts the whole process.

    python -m tests.gpu.graph_pool_runs recapture-over-a-live-block
    python -m tests.gpu.graph_pool_runs tier-moves MODEL_DIR
"""
from __future__ import annotations

import random
import sys

import torch

MIN_MOVES = 20


def recapture_over_a_live_block() -> None:
    """A block allocated during a capture outlives its graph (as a workspace allocated lazily on the capture
    stream does); once every graph is dropped, further captures into the runner's pool must still work."""
    from gh200rt.backends.cuda.graph_capture import CudaCapture
    from gh200rt.weights.schedule import NULL_HOOKS
    capture = CudaCapture(torch.device("cuda"))
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    held = []

    def step() -> torch.Tensor:
        held.append(torch.empty(1 << 20, device="cuda"))
        return x * 2 + 1
    for generation in range(4):
        captured = capture.capture(step, NULL_HOOKS)
        out = capture.replay(captured, NULL_HOOKS)
        torch.cuda.synchronize()
        assert torch.equal(out, x * 2 + 1), f"generation {generation}: the replay computed something else"
        del captured, out
        capture.graphs_dropped()
    print(f"4 generations captured, pool high-water {capture.pool_bytes} B")


def tier_moves(model_dir: str) -> None:
    """A dynamic engine with graphs through 20+ tier moves, requests in flight, against an eager engine
    making the same moves at the same steps."""
    from gh200rt.engine.tier_controller import Move, TierController
    from gh200rt.weights.tiers import LAYER_TIERS, Tier
    from tests.engine.real_models import assert_same_or_near_tie
    from tests.graphs.decode_runs import LAYERS, generate_outputs, make_engine

    class MoveEveryStep:
        """Each step, one layer to another tier: the same sequence on any engine that runs the same steps."""

        def __init__(self, store):
            self.store, self.rng = store, random.Random(0)

        def decide(self, signals):
            layer = self.rng.randrange(LAYERS)
            tier = self.rng.choice([t for t in LAYER_TIERS if t != self.store.tiers[layer]])
            return Move(layer, tier, "test")

    results = {}
    for graphs in (False, True):
        engine = make_engine(model_dir, graphs=graphs, offload="dynamic", check_graph_addresses=graphs)
        assert (engine.graphs is not None) == graphs
        engine.controller = TierController(engine.store, MoveEveryStep(engine.store))
        outputs = generate_outputs(engine)
        moves = sum(engine.controller.counts.values())
        captures = engine.graphs.captures if graphs else 0
        results[graphs] = (outputs, moves, engine.controller.refused)
        print(f"graphs={graphs}: {moves} moves ({engine.controller.refused} refused), {captures} captures")
        engine.close()
    (eager, eager_moves, eager_refused), (replayed, moves, refused) = results[False], results[True]
    assert (moves, refused) == (eager_moves, eager_refused), "both engines must make the same moves"
    assert moves >= MIN_MOVES, f"only {moves} tier moves happened"
    assert_same_or_near_tie(eager, replayed, "graphs through tier moves")


if __name__ == "__main__":
    scenario, *args = sys.argv[1:]
    {"recapture-over-a-live-block": recapture_over_a_live_block, "tier-moves": tier_moves}[scenario](*args)
