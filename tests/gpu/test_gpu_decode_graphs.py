"""CUDA-graph decode on a GPU (issue 12, acceptance 2): for each placement, replayed decode steps
generate what eager steps generate (a differing token must be a near tie; logprobs within the dtype's
tolerance), with NaN-poisoned staging slots, and with eager prefills interleaved between replays
without a device synchronisation; capture time and graph pool bytes are reported."""
import pytest
import torch

from tests.engine.real_models import assert_same_or_near_tie, save_tiny_llama
from tests.graphs.decode_runs import BUCKETS, EVERY_2ND, LAYERS, PLACEMENTS, generate_outputs, make_engine, staggered

pytestmark = pytest.mark.gpu
LOGPROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny6-gpu-graphs")), num_layers=LAYERS)


def assert_close_logprobs(reference, outputs, tolerance: float) -> None:
    """Where the tokens agree, the chosen tokens' logprobs agree within ``tolerance``."""
    worst = 0.0
    for ref, out in zip(reference, outputs):
        a, b = ref.outputs[0], out.outputs[0]
        for token_a, token_b, lp_a, lp_b in zip(a.token_ids, b.token_ids, a.logprobs, b.logprobs):
            if token_a != token_b:
                break
            worst = max(worst, abs(lp_a[token_a].logprob - lp_b[token_b].logprob))
    assert worst <= tolerance, f"logprobs differ by up to {worst:.3g} (tolerance {tolerance})"


def report(engine, label: str) -> None:
    graphs = engine.graphs
    print(f"{label}: {graphs.captures} captures in {graphs.capture_seconds * 1e3:.1f} ms, "
          f"graph pool {graphs.pool_bytes / 2**20:.2f} MiB")


CASES = [(label, "float32") for label in PLACEMENTS] + [("resident", "bfloat16"), ("direct + streamed", "bfloat16")]


@pytest.mark.parametrize("label,dtype", CASES)
def test_replay_matches_eager_for_each_placement_with_poisoned_slots(tiny_dir, label, dtype):
    eager_engine = make_engine(tiny_dir, graphs=False, dtype=dtype, **PLACEMENTS[label])
    assert eager_engine.graphs is None and eager_engine.runner.device == "cuda"
    eager = generate_outputs(eager_engine)
    eager_engine.close()
    engine = make_engine(tiny_dir, graphs=True, dtype=dtype, check_graph_addresses=True, **PLACEMENTS[label])
    outputs = generate_outputs(engine)
    assert_same_or_near_tie(eager, outputs, label)
    assert_close_logprobs(eager, outputs, LOGPROB_TOLERANCE[dtype])
    graphs = engine.graphs
    assert sorted(graphs.graphs) == BUCKETS and graphs.captures == len(BUCKETS)
    # booked: the start-up estimate, or the pool's real size where it grew past it
    assert graphs.pool_bytes > 0 and engine.ledger.by_kind["graph_pools"] >= graphs.pool_bytes
    assert engine.stats().graph_pool_bytes == graphs.pool_bytes
    report(engine, f"{label} {dtype}")
    # the replays ran: a second pass captures nothing new and still generates the same
    again = generate_outputs(engine)
    assert graphs.captures == len(BUCKETS)
    assert_same_or_near_tie(eager, again, f"{label}, replayed")
    engine.close()


@pytest.mark.parametrize("label", ["resident", "stream K2 d1", "direct + streamed"])
def test_eager_prefills_interleave_with_replays_without_synchronising(tiny_dir, label, monkeypatch):
    eager_engine = make_engine(tiny_dir, graphs=False, **PLACEMENTS[label])
    reference = staggered(eager_engine)
    eager_engine.close()
    engine = make_engine(tiny_dir, graphs=True, **PLACEMENTS[label])
    generate_outputs(engine)                       # captures every bucket (capture itself synchronises)
    captures = engine.graphs.captures
    replays = []
    real_replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(1) or real_replay(graph))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("a step synchronised the device"))
    outputs = staggered(engine)
    assert engine.graphs.captures == captures and len(replays) > 10
    assert_same_or_near_tie(reference, outputs, f"{label}, prefills between replays")
    assert_close_logprobs(reference, outputs, LOGPROB_TOLERANCE["float32"])
    engine.close()


def test_a_tier_move_on_a_gpu_recaptures_and_keeps_addresses_checked(tiny_dir):
    """The reference makes the same moves eagerly: a promoted layer holds whatever its host copy held."""
    from gh200rt.weights.tiers import Tier

    def generate_moving(engine):
        generate_outputs(engine)
        engine.store.set_tier(0, Tier.STREAMED)
        engine.store.set_tier(3, Tier.RESIDENT)
        return generate_outputs(engine)
    options = dict(offload="none", layer_tiers=EVERY_2ND, staging_slots=2, prefetch_distance=1)
    eager_engine = make_engine(tiny_dir, graphs=False, **options)
    reference = generate_moving(eager_engine)
    eager_engine.close()
    engine = make_engine(tiny_dir, graphs=True, check_graph_addresses=True, **options)
    outputs = generate_moving(engine)
    assert engine.graphs.captures == 2 * len(BUCKETS)
    assert_same_or_near_tie(reference, outputs, "after a tier move")
    assert_close_logprobs(reference, outputs, LOGPROB_TOLERANCE["float32"])
    report(engine, "after a tier move")
    engine.close()


def test_replayed_graphs_count_their_staging_copies_and_waits(tiny_dir, monkeypatch):
    """The first GPU run reported 0.24 GB/s of copies for replayed steps moving ~53 GB/s: a replay runs no
    Python. Each replay must add the bytes its capture copied (every streamed layer once), and the time its
    waits took where timing events can be captured."""
    engine = make_engine(tiny_dir, graphs=True, **PLACEMENTS["stream K2 d1"])
    generate_outputs(engine)                        # captures every bucket
    replays = []
    real_replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(1) or real_replay(graph))
    before = engine.stats()
    generate_outputs(engine)
    after = engine.stats()
    store = engine.store
    per_step = sum(store.slabs[layer].nbytes for layer in range(LAYERS))
    copied = after.weight_bytes_copied - before.weight_bytes_copied
    assert replays and copied >= len(replays) * per_step, (copied, len(replays), per_step)
    if store.backend._graph_copies.timed:
        assert after.copy_wait_seconds > before.copy_wait_seconds
    print(f"{len(replays)} replays copied {copied / 1e6:.1f} MB; timing inside graphs: "
          f"{store.backend._graph_copies.timed}")
    engine.close()
