"""WeightStore: the one writer of WeightRef.current. Layers moved between tiers between steps compute exactly
what all-resident computes (fp32, NaN-poisoned slots); the ledger follows every move; a promotion that does
not fit changes nothing; a closed store refuses to move anything."""
import random

import pytest
import torch

from gh200rt.config import MemoryConfig
from gh200rt.memory.ledger import DeviceMemoryLedger, LedgerOverCommit
from gh200rt.planner.cost_model import model_sizes
from gh200rt.planner.planner import make_plan
from gh200rt.platform.detect import detect
from gh200rt.sampling_params import SamplingParams
from gh200rt.weights.schedule import NULL_HOOKS
from gh200rt.weights.store import NoFreeRun, WeightStore
from gh200rt.weights.tiers import LAYER_TIERS, Tier
from tests.tiers.greedy import greedy
from tests.tiers.test_engine_placement import engine, tiny_dir  # noqa: F401 (fixture)
from tests.tiers.test_invariance import ARCH, _model

STEPS = 14
PROMPT = [1, 5, 9, 13]


def run(model, hooks=NULL_HOOKS, between_steps=None):
    return greedy(model, PROMPT, STEPS, num_blocks=4, hooks=hooks, between_steps=between_steps)


@pytest.fixture
def reference():
    """All-resident logits and tokens, computed beside each test's placed run: under the thread count and kernels
    the test runs with (a reference computed at collection saw another process state in a full run)."""
    return run(_model())


def placed(keep_host_copies=False, ledger=None, **memory):
    memory = {"staging_slots": 2, "prefetch_distance": 1, **memory}
    plan = make_plan(model_sizes(ARCH, "fp32"), detect("cpu"), MemoryConfig(**memory), 1 << 30)
    model = _model()
    store = WeightStore(model, platform=plan.platform, poison=True, ledger=ledger, keep_host_copies=keep_host_copies)
    store.apply(plan)
    return model, store


@pytest.mark.parametrize("keep_host_copies", [False, True], ids=["slabs on demand", "every layer on the host"])
@pytest.mark.parametrize("start", [dict(offload="none"), dict(offload="stream"),
                                   dict(offload="none", layer_tiers="1:streamed,3:streamed,4:direct")],
                         ids=["all resident", "all streamed", "mixed"])
def test_random_tier_moves_between_steps_are_bit_identical(keep_host_copies, start, reference):
    model, store = placed(keep_host_copies, **start)
    rng = random.Random(sum(map(ord, str(start))) + keep_host_copies)
    moves = []

    def move(step):
        for _ in range(rng.randint(0, 3)):
            layer, tier = rng.randrange(ARCH.num_layers), rng.choice(list(LAYER_TIERS))
            store.set_tier(layer, tier)
            moves.append((step, layer, tier))

    logits, tokens = run(model, store, move)
    assert tokens == reference[1] and torch.equal(logits, reference[0]), moves
    assert {t for _, _, t in moves} == set(LAYER_TIERS)
    store.close()


def test_every_tier_to_every_tier(reference):
    model, store = placed(offload="none")
    path = [Tier.STREAMED, Tier.DIRECT, Tier.RESIDENT, Tier.DIRECT, Tier.STREAMED, Tier.RESIDENT]
    logits, tokens = run(model, store, lambda step: [store.set_tier(layer, path[step % len(path)])
                                                        for layer in (0, 3, 5)])
    assert tokens == reference[1] and torch.equal(logits, reference[0])
    assert store.tiers[0] == path[(STEPS - 1) % len(path)]
    store.close()


def test_ledger_follows_moves_and_a_promotion_that_does_not_fit_changes_nothing(reference):
    ledger = DeviceMemoryLedger(1 << 30)
    model, store = placed(ledger=ledger, offload="none", layer_tiers="2:streamed,5:streamed")
    layer_bytes = sum(r.current.nbytes for r in model.layer_weight_refs(0).values())
    resident = ledger.by_kind["resident_weights"]
    assert ledger.by_kind["staging_ring"] == 2 * store.slabs[2].nbytes
    store.set_tier(0, Tier.DIRECT)
    assert ledger.by_kind["resident_weights"] == resident - layer_bytes == store.device_weight_bytes
    store.set_tier(0, Tier.RESIDENT)
    assert ledger.by_kind["resident_weights"] == resident
    store.set_tier(1, Tier.STREAMED)
    ledger.capacity = ledger.used + layer_bytes // 2        # too little left to promote a layer
    before = {name: ref.current for name, ref in model.layer_weight_refs(1).items()}
    with pytest.raises(LedgerOverCommit, match="resident_weights"):
        store.set_tier(1, Tier.RESIDENT)
    assert store.tiers[1] == Tier.STREAMED
    assert {name: ref.current for name, ref in model.layer_weight_refs(1).items()} == before
    logits, tokens = run(model, store)
    assert tokens == reference[1] and torch.equal(logits, reference[0])
    store.close()


def test_a_ring_appears_when_the_first_layer_streams(reference):
    ledger = DeviceMemoryLedger(1 << 30)
    model, store = placed(ledger=ledger, offload="none")
    assert store.backend is None and ledger.by_kind["staging_ring"] == 0
    store.set_tier(3, Tier.STREAMED)
    assert len(store.backend.slots) == 2 and ledger.by_kind["staging_ring"] == 2 * store.slabs[3].nbytes
    logits, tokens = run(model, store)
    assert tokens == reference[1] and torch.equal(logits, reference[0])
    assert store.backend.bytes_copied > 0
    store.close()


def test_a_closed_store_moves_nothing():
    model, store = placed(offload="stream")
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.set_tier(0, Tier.RESIDENT)
    store.close()


def test_engine_steps_with_tier_moves_match_all_resident(tiny_dir):  # noqa: F811
    """Shared prefixes (one request arrives per step, so later ones hit the prefix cache), preemption (a KV
    pool of 10 blocks for 10 requests) and tier moves every other step: the tokens all-resident produces.
    Logprobs agree to float32 rounding only: a promotion takes arena blocks, which changes who gets
    preempted, and a recomputed prompt goes through a GEMM of another shape than its decode steps did."""
    prompts = [[7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23 + i] for i in range(6)] + \
        [[40 + i, 41, 42] for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)

    def run(eng, moves=None):
        done, step = {}, 0
        while step < len(prompts) or eng.has_unfinished_requests():
            if step < len(prompts):
                eng.add_request(str(step), None, params, prompt_token_ids=prompts[step])
            if moves is not None and step % 2 == 1:
                moves(step)
            for out in eng.step():
                if out.finished:
                    completion = out.outputs[0]
                    done[out.request_id] = (completion.token_ids, [sorted((t, p.logprob) for t, p in lp.items())
                                                                   for lp in completion.logprobs])
            step += 1
        return [done[str(i)] for i in range(len(prompts))], eng.stats()

    reference, _ = run(engine(tiny_dir, offload="none", num_kv_blocks=10))
    eng = engine(tiny_dir, offload="none", layer_tiers="2:streamed,4:streamed", staging_slots=2, prefetch_distance=1,
                 num_kv_blocks=10)
    rng = random.Random(3)
    refused = []

    def move(step):
        layer, tier = rng.randrange(6), rng.choice(list(LAYER_TIERS))
        try:
            eng.store.set_tier(layer, tier)
        except NoFreeRun:                          # every window holds a request's block: it stays put
            refused.append(layer)
            assert eng.store.tiers[layer] != Tier.RESIDENT
        held = {b for seq in eng.scheduler.running for b in seq.block_ids}
        runs = {b for start, n in eng.kv.pool.runs.items() for b in range(start, start + n)}
        assert not held & runs, "a weight run took a block a running request holds"

    got, stats = run(eng, move)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in reference]
    for (_, got_lps), (_, want_lps) in zip(got, reference):
        for g, w in zip(got_lps, want_lps):
            assert [t for t, _ in g] == [t for t, _ in w]
            assert max(abs(a - b) for (_, a), (_, b) in zip(g, w)) < 1e-5
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert sum(stats.layers_per_tier.values()) == 6
    eng.close()
