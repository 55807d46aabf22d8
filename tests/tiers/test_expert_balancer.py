"""Expert placement that learns the routing (``--offload dynamic``, engine/expert_balancer.py): the most-used
experts become resident, swaps respect the margin and the per-look bound, and an engine that swaps experts
between steps still generates exactly what all-resident generates (float32, poisoned slots)."""
import pytest
import torch

from gh200rt.engine.expert_balancer import ExpertBalancer
from gh200rt.weights.tiers import Tier
from tests.tiers.test_engine_placement import engine, run
from tests.tiers.test_moe_placement import moe_dir, reference  # noqa: F401  (fixtures)

R, D = Tier.RESIDENT, Tier.DIRECT


class FakeStore:
    def __init__(self, tiers):
        self.expert_tiers = {0: list(tiers)}
        self.moves = []

    def set_expert_tier(self, layer, expert, tier):
        self.moves.append((layer, expert, Tier(tier)))
        self.expert_tiers[layer][expert] = Tier(tier)


class FakeModel:
    def __init__(self, experts):
        self.counts = torch.zeros(experts, dtype=torch.int64)

    def routing_counts(self):
        return {0: self.counts.clone()}


def balancer(tiers, **options):
    store, model = FakeStore(tiers), FakeModel(len(tiers))
    return ExpertBalancer(store, model, interval_steps=1, **options), store, model


def test_the_most_used_offloaded_expert_takes_the_least_used_residents_place():
    b, store, model = balancer([R, R, D, D, D])
    model.counts += torch.tensor([10, 2, 0, 30, 5])
    assert b.between_steps() == [(0, 3, 1)]                 # expert 3 (30) in, expert 1 (2) out
    assert store.moves == [(0, 1, D), (0, 3, R)]            # demoted first: the promotion reuses its bytes
    assert store.expert_tiers[0] == [R, D, D, R, D]
    assert b.swaps == 1 and b.resident_share() == pytest.approx(40 / 47)


def test_a_margin_keeps_experts_of_similar_use_in_place():
    b, store, model = balancer([R, D], margin=0.5, min_tokens=4)
    model.counts += torch.tensor([20, 29])                  # 29 < 1.5 * 20 + 4
    assert b.between_steps() == [] and store.moves == []
    model.counts += torch.tensor([0, 40])                   # decayed: 10 vs 54.5
    assert b.between_steps() == [(0, 1, 0)]


def test_swaps_per_look_are_bounded_and_usage_decays():
    b, store, model = balancer([R, R, R, D, D, D], max_swaps=2, decay=0.5)
    model.counts += torch.tensor([1, 1, 1, 50, 60, 70])
    assert [hot for _, hot, _ in b.between_steps()] == [5, 4]   # the two most used, one look
    assert store.expert_tiers[0].count(R) == 3
    model.counts += torch.tensor([0, 0, 0, 0, 0, 0])
    assert [hot for _, hot, _ in b.between_steps()] == [3]      # next look: the third
    assert store.expert_tiers[0] == [D, D, D, R, R, R]


def test_only_every_interval_steps():
    b, store, model = balancer([R, D])
    b.interval_steps = 3
    model.counts += torch.tensor([0, 100])
    assert b.between_steps() == [] and b.between_steps() == []
    assert b.between_steps() == [(0, 1, 0)]


def test_an_engine_swapping_experts_gives_the_all_resident_tokens(moe_dir, reference):  # noqa: F811
    eng = engine(moe_dir, offload="dynamic", moe_expert_tier="direct", retier_interval_steps=1, num_kv_blocks=32)
    store = eng.store
    for layer in store.expert_tiers:                        # a start that ignores the routing: experts 0-1
        for expert in (0, 1):
            store.set_expert_tier(layer, expert, "resident")
    assert eng.balancer is not None
    assert run(eng) == reference
    stats = eng.stats()
    assert stats.expert_swaps > 0 and stats.expert_swaps == eng.balancer.swaps
    assert stats.experts_per_tier["resident"] == 2 * len(store.expert_tiers)     # swaps keep the count
    for layer, counts in stats.routed_tokens.items():
        assert sum(counts) > 0 and len(counts) == 8
        usage = eng.balancer._usage[layer]
        resident = [e for e, t in enumerate(store.expert_tiers[layer]) if t == Tier.RESIDENT]
        hottest = max(range(8), key=lambda e: float(usage[e]))
        assert hottest in resident or usage[hottest] < 1.5 * min(usage[e] for e in resident) + 4
    eng.close()
