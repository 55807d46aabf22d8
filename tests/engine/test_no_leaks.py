"""Acceptance 4: after 200 requests with random aborts mid-generation, every KV block is free or
held only by the evictable prefix cache."""
import random

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.sampling_params import SamplingParams
from tests.engine.toy_model import ToyArch, ToyModel, ToyTokenizer


def test_200_requests_with_random_aborts_leave_no_block_held():
    arch = ToyArch()
    eng = LLMEngine(ToyModel(arch), ToyTokenizer(), arch,
                    EngineConfig.from_kwargs(num_kv_blocks=40, block_size=4, max_model_len=64,
                                             max_num_batched_tokens=24, max_num_seqs=16))
    rng = random.Random(0)
    shared = [rng.randrange(1, 64) for _ in range(9)]
    added = aborted = finished = 0
    live: set[str] = set()
    while added < 200 or eng.has_unfinished_requests():
        while added < 200 and len(live) < 24:
            prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(1, 64) for _ in range(rng.randrange(1, 20))]
            params = SamplingParams(temperature=rng.choice([0.0, 0.8]), max_tokens=rng.randrange(1, 20),
                                    n=rng.choice([1, 1, 2]), seed=rng.choice([None, 7]), ignore_eos=True)
            eng.add_request(f"r{added}", None, params, prompt_token_ids=prompt)
            live.add(f"r{added}")
            added += 1
        for out in eng.step():
            if out.finished:
                live.discard(out.request_id)
                finished += 1
        for rid in sorted(live):
            if rng.random() < 0.01:
                eng.abort(rid)
                live.discard(rid)
                aborted += 1
    stats = eng.stats()
    assert aborted > 10 and finished > 100 and stats.num_preemptions > 0, (aborted, finished, stats)
    assert stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0
    pool = eng.kv.pool
    assert all(b.ref_count == 0 for b in pool.blocks)
    assert pool.num_free == pool.num_blocks and stats.kv_blocks_cached_free > 0
    assert not eng.requests
