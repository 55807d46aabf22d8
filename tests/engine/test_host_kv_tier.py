"""The host KV tier in the engine: blocks evicted from a small device pool come back from host memory with the bits
a device hit gives, on every CPU route; preempted requests reuse what the tier kept; an fp8 pool too; and a tier
that does not fit is refused with what to do (tensor parallelism: tests/distributed/test_kv_host_tier_tp.py)."""
import random
import threading

import pytest

from gh200rt.config import CacheConfig, EngineConfig
from gh200rt.engine.host_kv_tier import MARGIN_BYTES, host_tier_blocks
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel, assert_same_or_near_tie, save_tiny_llama
from tests.engine.route_engines import route_llm


def conversations(vocab: int, count: int, system: int = 40, seed: int = 0) -> list[list[int]]:
    """``count`` first turns of 52 tokens, the first ``system`` of them shared."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(system)]
    return [shared + [rng.randrange(3, vocab) for _ in range(52 - system)] for _ in range(count)]


def talk(llm, firsts: list[list[int]], turns: int, max_tokens: int = 4) -> list[tuple]:
    """Each conversation in turn, ``turns`` times: the next prompt is the last one, its answer and a new message."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    rng = random.Random(1)
    prompts, seen = [list(p) for p in firsts], []
    for _ in range(turns):
        for i, prompt in enumerate(prompts):
            out = llm.generate([prompt], params)[0].outputs[0]
            seen.append((tuple(out.token_ids), tuple(tuple(sorted(d.items())) for d in out.logprobs)))
            prompts[i] = prompt + list(out.token_ids) + [rng.randrange(3, 100) for _ in range(6)]
    return seen


def synchronous_stores(llm) -> None:
    """Each store to the host tier done before the engine goes on: on a loaded machine the copy thread can lag behind
    the lookup that wants the block, which then (correctly) recomputes it; these tests are about what the lookup finds
    (the copy thread's own behaviour: tests/kv/test_kv_offload.py)."""
    tier, store = llm.engine.host_tier, llm.engine.host_tier.store

    def store_and_wait(*args):
        store(*args)
        tier.wait_for_stores()
    tier.store = store_and_wait


def test_blocks_back_from_host_memory_give_a_device_hits_bits(cpu_route, short_smollm2):
    firsts = conversations(1000, count=3, system=0)
    with route_llm(cpu_route, short_smollm2, max_model_len=128, num_kv_blocks=64) as llm:
        want = talk(llm, firsts, turns=2, max_tokens=2)
        assert llm.engine.stats().prefix_cache_hit_tokens >= 3 * 48     # every second turn hit on the device
    # 8 blocks hold two conversations: by their second turns the first two conversations' blocks were reused, and
    # are in host memory; loaded back, or read there by the route's attention
    for reads in ("load", "in_place"):
        with route_llm(cpu_route, short_smollm2, max_model_len=128, num_kv_blocks=8, kv_offloading_size="64MiB",
                       kv_offloading_reads=reads) as llm:
            synchronous_stores(llm)
            got = talk(llm, firsts, turns=2, max_tokens=2)
            host = llm.engine.stats().kv_host
        assert got == want, f"{cpu_route.name}: tokens or logprobs differ with the host KV tier's {reads}"
        if reads == "load":
            assert host.hit_tokens >= 2 * 48 and host.loaded_blocks >= 6, host
        else:       # blocks read in place take no device block: more of the later turns hit on the device
            assert host.hit_tokens >= 48 and host.read_in_place_blocks >= 3, host


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return SharedModel(tiny_path)


def test_preempted_requests_come_back_through_the_host_tier(tiny):
    prompts = conversations(256, count=12)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = tiny.llm(num_kv_blocks=128, max_model_len=96).generate(prompts, params)
    llm = tiny.llm(num_kv_blocks=14, max_model_len=96, kv_offloading_size="16MiB")
    synchronous_stores(llm)
    got = llm.generate(prompts, params)
    stats = llm.engine.stats()
    assert stats.num_preemptions > 0, "the small pool did not force a preemption"
    assert stats.kv_host.hit_tokens > 0 and stats.kv_host.stored_blocks > 0, stats.kv_host
    assert_same_or_near_tie(want, got, "preempted through the host tier")
    # what the tier controller weighs a demotion against: the preempted tokens, the tier keeping their full blocks
    signals = llm.engine.tier_signals()
    assert signals.preempted_tokens > 0 and 0 < signals.preempted_kept_tokens <= signals.preempted_tokens
    assert signals.preempted_kept_tokens % 16 == 0 and signals.load_seconds_per_token > 0
    assert llm.engine.tier_signals().preempted_tokens == 0, "counted once, since the last look"


def test_an_fp8_pool_through_host_memory_keeps_its_bits(tiny):
    firsts = conversations(256, count=5)
    want = talk(tiny.llm(num_kv_blocks=64, max_model_len=128, kv_cache_dtype="fp8"), firsts, turns=2)
    llm = tiny.llm(num_kv_blocks=8, max_model_len=128, kv_cache_dtype="fp8", kv_offloading_size="8MiB",
                   kv_offloading_reads="load",
                   kv_offloading_write_policy="write_back")
    assert talk(llm, firsts, turns=2) == want
    assert llm.engine.stats().kv_host.loaded_blocks > 0


def test_a_tier_larger_than_host_memory_is_refused_with_the_size_that_fits():
    config = EngineConfig.from_kwargs(kv_offloading_size="64")
    available = MARGIN_BYTES + (10 << 30)
    with pytest.raises(ValueError, match=r"64: the host KV tier would take 64\.00 GiB, but host memory has 12\.00 "
                                         r"GiB available .* give at most 10\.00 GiB \(--kv-offloading-size 10\.00\)"):
        host_tier_blocks(config.cache, 1 << 20, available)
    assert host_tier_blocks(CacheConfig(kv_offloading_size="10"), 1 << 20, available) == 10 << 10
    assert host_tier_blocks(CacheConfig(kv_offloading_size="auto"), 1 << 20, available) == 5 << 10
    assert host_tier_blocks(CacheConfig(), 1 << 20, available) == 0
    with pytest.raises(ValueError, match="hold no KV block of 1048576 bytes .* give at least 1.00 MiB"):
        host_tier_blocks(CacheConfig(kv_offloading_size="512KiB"), 1 << 20, available)


@pytest.mark.parametrize("options, message", [
    (dict(kv_offloading_size="4", kv_offloading_backend="lmcache"), "LMCache is not part of gh200rt"),
    (dict(kv_offloading_size="4", enable_prefix_caching=False), "needs prefix caching"),
    (dict(kv_offloading_size="lots"), "cannot read 'lots'; give GiB"),
    (dict(kv_offloading_disk_dir="/tmp/x", prefix_caching_hash_algo="sha256"), "add --kv-offloading-size"),
    (dict(kv_offloading_size="4", kv_offloading_disk_dir="/tmp/x"), "add --prefix-caching-hash-algo sha256"),
    (dict(kv_offloading_disk_size=4.0), "add --kv-offloading-disk-dir"),
    (dict(kv_offloading_size="4", kv_offloading_disk_dir="/tmp/x", prefix_caching_hash_algo="sha256",
          tensor_parallel_size=2), "disk-dir with --tensor-parallel-size > 1 is not supported yet"),
])
def test_what_the_tier_cannot_do_is_refused(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_kwargs(**options)


def test_the_plan_shows_the_tier_beside_the_host_weights(capsys, monkeypatch):
    from gh200rt import plan
    monkeypatch.setattr(plan, "host_available_bytes", lambda node: MARGIN_BYTES + (200 << 30))
    model = ["--model", "tests/fixtures/llama31_70b_fp8", "--platform", "gh200-96g", "--offload", "stream"]
    assert plan.main([*model, "--kv-offloading-size", "8"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    per_block = 2 * 8 * 128 * 80 * 2 * 16                 # bf16 K+V of 80 layers x 8 KV heads x 128, 16 tokens
    assert line.startswith("host memory: weights ") and f"KV tier 8.00 GiB ({(8 << 30) // per_block} blocks" in line
    assert plan.main([*model, "--kv-offloading-size", "1000"]) == 2
    assert "give at most" in capsys.readouterr().err


def test_the_multi_turn_benchmark_runs_the_tier_off_and_on(tiny_path, capsys):
    from gh200rt.bench.__main__ import main
    assert main(["multi-turn", "--model", tiny_path, "--dtype", "float32", "--conversations", "4", "--turns", "3",
                 "--system-tokens", "32", "--user-tokens", "16", "--output-tokens", "2"]) == 0
    out = capsys.readouterr().out
    off, on = (line.split() for line in out.splitlines() if line.startswith("tier "))
    assert (off[:2], on[:2]) == (["tier", "off"], ["tier", "on"])
    assert int(off[-6]) == 0 < int(on[-6])           # host hit tokens: none without the tier, some with it
    assert int(on[-3]) == 0                          # blocks read in place: on loads them
    assert "turn >= 2 TTFT p50: " in out and "(on)" in out


def test_the_multi_turn_benchmark_restarts_the_engine_each_turn(tiny_path, capsys):
    """A new engine every turn: the tier in host memory starts empty, and only the disk tier brings histories back."""
    from gh200rt.bench.__main__ import main
    assert main(["multi-turn", "--model", tiny_path, "--dtype", "float32", "--conversations", "2", "--turns", "3",
                 "--system-tokens", "32", "--user-tokens", "16", "--output-tokens", "2", "--order", "on,disk",
                 "--restart-each-turn"]) == 0
    out = capsys.readouterr().out
    on, disk = (line.split() for line in out.splitlines() if line.startswith("tier "))
    assert (on[1], disk[1]) == ("on", "disk") and "a new engine every turn" in out
    assert int(on[-2]) == 0 < int(disk[-2])          # blocks read from disk: only the disk tier has any
    assert int(disk[-6]) >= 16 * int(disk[-2])       # and the host tier served them


def test_blocks_on_disk_serve_an_engine_started_later(tiny, tmp_path):
    """A restart: the second engine's device pool and host tier start empty, and the first turns it is asked again
    come back from disk with the first engine's tokens and logprobs."""
    firsts = conversations(250, count=3, system=20)
    options = dict(max_model_len=128, num_kv_blocks=64, kv_offloading_size="64MiB", prefix_caching_hash_algo="sha256",
                   kv_offloading_disk_dir=str(tmp_path / "kv"), kv_offloading_reads="load")
    first = tiny.llm(**options)
    want = talk(first, firsts, turns=1)
    first.engine.host_tier.wait_for_stores()
    written = first.engine.stats().kv_host.disk.written_blocks
    first.engine.close()
    again = tiny.llm(**options)
    got = talk(again, firsts, turns=1)
    host = again.engine.stats().kv_host
    again.engine.close()
    assert got == want, "tokens or logprobs differ with blocks read back from disk"
    # 3 reusable blocks a first turn, the first shared: 7 blocks, each read back once
    assert written == 7 and host.disk.hit_blocks == 7 and host.hit_tokens == 7 * 16, (written, host)


def test_a_prefix_read_from_disk_holds_up_no_step(tiny, tmp_path, monkeypatch):
    """While a request's cached prefix is read from disk (held up here), it waits holding nothing and the running
    request decodes on, step after step; once the blocks are in host memory it is admitted with them as its hit and
    answers as the engine that wrote them did."""
    firsts = conversations(250, count=2, system=0)
    options = dict(max_model_len=128, num_kv_blocks=64, kv_offloading_size="64MiB", prefix_caching_hash_algo="sha256",
                   kv_offloading_disk_dir=str(tmp_path / "kv"))
    first = tiny.llm(**options)
    want = talk(first, firsts[1:], turns=1)
    first.engine.host_tier.wait_for_stores()
    first.engine.close()
    again = tiny.llm(**options)
    engine, disk = again.engine, again.engine.host_tier.disk
    release = threading.Event()
    read_into = disk.read_into

    def held_read(block, out):
        assert release.wait(timeout=60)
        return read_into(block, out)
    monkeypatch.setattr(disk, "read_into", held_read)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    engine.add_request("running", None, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                       prompt_token_ids=firsts[0])
    engine.step()
    engine.add_request("from disk", None, params, prompt_token_ids=firsts[1])
    running = engine.requests["running"].seqs[0]
    waiting = engine.requests["from disk"].seqs[0]
    before = len(running.output_token_ids)
    for _ in range(5):
        engine.step()
    # the reads are queued (the reader thread, at a lower priority, may not have started them yet) and held
    assert engine.host_tier.reading_from_disk and disk.stats.hits == 1, "the prefix was not looked up on disk"
    assert len(running.output_token_ids) == before + 5, "a step waited for the disk read"
    assert not waiting.block_ids and waiting.num_computed_tokens == 0
    release.set()
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0]
    got = outputs["from disk"]
    assert [(tuple(got.token_ids), tuple(tuple(sorted(d.items())) for d in got.logprobs))] == want
    host = engine.stats().kv_host
    again.engine.close()
    assert host.disk.hit_blocks == 3 and host.hit_tokens == 3 * 16, host
