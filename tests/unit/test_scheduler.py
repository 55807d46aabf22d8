from gh200rt.kv.kv_manager import KVCacheManager
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence, Status
from gh200rt.scheduler.scheduler import Scheduler


def seq(name, n_prompt, arrival=0, **params):
    return Sequence(name, name, 0, list(range(1, n_prompt + 1)), SamplingParams(**params), arrival)


def run_step(sched, out, token=7):
    sched.step_done(out)
    for item in out.scheduled:
        if item.seq.num_computed_tokens == item.seq.num_tokens:
            item.seq.append_token(token)


def plan(out):
    return [(i.seq.seq_id, i.num_new_tokens) for i in out.scheduled]


def test_chunked_prefill_runs_alongside_decodes():
    sched = Scheduler(KVCacheManager(64, 4), max_num_seqs=8, max_num_batched_tokens=10)
    a = seq("a", 3)
    sched.add(a)
    out = sched.schedule()
    assert plan(out) == [("a", 3)]
    run_step(sched, out)
    sched.add(seq("b", 25))
    out = sched.schedule()
    assert plan(out) == [("a", 1), ("b", 9)]          # decode first, then a 9-token chunk
    run_step(sched, out)
    out = sched.schedule()
    assert plan(out) == [("a", 1), ("b", 9)]
    run_step(sched, out)
    out = sched.schedule()
    assert plan(out) == [("a", 1), ("b", 7)]
    assert [i.samples for i in out.scheduled] == [True, True]


def test_max_num_seqs_limits_admission():
    sched = Scheduler(KVCacheManager(64, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for name in "abc":
        sched.add(seq(name, 2))
    out = sched.schedule()
    assert plan(out) == [("a", 2), ("b", 2)]
    assert [s.seq_id for s in sched.waiting] == ["c"]


def test_preemption_frees_newest_and_it_resumes_with_generated_tokens():
    kv = KVCacheManager(4, 2, enable_prefix_caching=False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=100)
    a, b = seq("a", 3), seq("b", 3)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert plan(out) == [("a", 3), ("b", 3)] and kv.num_free_blocks == 0
    run_step(sched, out)            # both now hold 4 tokens, 3 computed; the 4th fits in block 2
    out = sched.schedule()
    assert plan(out) == [("a", 1), ("b", 1)]
    run_step(sched, out)            # 5 tokens each: a needs a third block -> b is preempted
    out = sched.schedule()
    assert plan(out) == [("a", 1)]
    assert out.preempted == [b] and b.status is Status.WAITING and b.block_ids == []
    assert sched.num_preemptions == 1 and b.num_computed_tokens == 0
    run_step(sched, out)
    sched.finish(a)
    assert kv.num_free_blocks == 4
    out = sched.schedule()
    assert plan(out) == [("b", 5)]  # recomputes prompt + its 2 generated tokens, then samples
    assert b.all_token_ids == [1, 2, 3, 7, 7]


def test_a_preemption_counts_the_tokens_it_lets_go_of_not_a_prefix_others_hold():
    """The tier controller prices a preemption by the tokens it makes the engine compute again: b's first two
    blocks are a's too (the prefix cache), stay in the pool when b is freed and come back as hits, so they are not
    counted."""
    kv = KVCacheManager(6, 2)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=100)
    a, b = Sequence("a", "a", 0, [1, 2, 3, 4, 5], SamplingParams(), 0), Sequence("b", "b", 0, [1, 2, 3, 4, 9],
                                                                              SamplingParams(), 1)
    sched.add(a)
    run_step(sched, sched.schedule())
    sched.add(b)
    out = sched.schedule()
    assert b.num_cached_tokens == 4 and kv.tokens_shared_on_device(b) == 4
    computed = None
    while not out.preempted:
        run_step(sched, out)
        computed = b.num_computed_tokens
        out = sched.schedule()
    assert out.preempted == [b] and computed > 4
    assert sched.preempted_tokens == computed - 4 and sched.preempted_kept_tokens == 0
    assert kv.tokens_shared_on_device(a) == 0, "a's blocks are its own once b let go of them"


def test_abort_of_waiting_and_running_frees_blocks():
    kv = KVCacheManager(8, 2)
    sched = Scheduler(kv, max_num_seqs=1, max_num_batched_tokens=100)
    a, b = seq("a", 5), seq("b", 5)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert plan(out) == [("a", 5)]
    sched.finish(b)
    sched.finish(a)
    assert not sched.has_unfinished() and kv.num_free_blocks == 8


def test_prefix_hit_skips_cached_tokens():
    kv = KVCacheManager(16, 2)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=100)
    a = seq("a", 6)
    sched.add(a)
    run_step(sched, sched.schedule())
    b = seq("b", 6)
    sched.add(b)
    out = sched.schedule()
    assert plan(out) == [("a", 1), ("b", 2)]
    assert b.num_cached_tokens == 4 and b.block_ids[:2] == a.block_ids[:2]


def test_n_choices_wait_for_and_share_the_prompt_owner():
    kv = KVCacheManager(16, 2)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=4)
    owner = seq("o", 7)
    sibling = Sequence("s", "o", 1, list(owner.prompt_token_ids), owner.params, 1)
    sibling.share_prompt_from = owner
    sched.add(owner)
    sched.add(sibling)
    out = sched.schedule()
    assert plan(out) == [("o", 4)]         # sibling waits: owner's prompt not computed yet
    run_step(sched, out)
    out = sched.schedule()
    assert plan(out) == [("o", 3)]
    run_step(sched, out)
    out = sched.schedule()
    assert plan(out) == [("o", 1), ("s", 1)]
    assert sibling.block_ids[:3] == owner.block_ids[:3]
    assert all(kv.pool.blocks[b].ref_count == 2 for b in owner.block_ids[:3])



def test_drafted_tokens_fit_the_budget():
    sched = Scheduler(KVCacheManager(4, 4), max_num_seqs=8, max_num_batched_tokens=4)
    a = seq("a", 3)
    sched.add(a)
    run_step(sched, sched.schedule())                 # a: 3 prompt tokens, one sampled: 4 tokens, 3 computed
    a.spec_drafts = [5, 6, 7, 8]
    out = sched.schedule()
    assert plan(out) == [("a", 4)] and out.scheduled[0].draft_token_ids == [5, 6, 7]   # the budget holds 3
    item = out.scheduled[0]
    assert item.samples and not item.computes_prompt and item.token_ids() == [7, 5, 6, 7]
    sched.step_done(out)
    assert a.num_computed_tokens == 4                 # drafted positions count once verification keeps them


def test_drafts_give_way_when_the_pool_is_short():
    sched = Scheduler(KVCacheManager(3, 4), max_num_seqs=8, max_num_batched_tokens=16)
    a, b = seq("a", 2), seq("b", 7)
    sched.add(a)
    run_step(sched, sched.schedule())
    sched.add(b)
    run_step(sched, sched.schedule())                 # a holds 1 block, b 2: the pool is full
    a.spec_drafts = [5, 6, 7]                         # they would need a fourth block
    out = sched.schedule()
    assert [(i.seq.seq_id, i.num_new_tokens, i.draft_token_ids) for i in out.scheduled] == [("a", 1, []),
                                                                                            ("b", 1, [])]
    assert not out.preempted                          # the drafts went, nobody was preempted
