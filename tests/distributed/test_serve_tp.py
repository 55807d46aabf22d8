"""``python -m gh200rt.serve --tensor-parallel-size 2`` on the CPU: a request gets TP=1's tokens, SIGTERM leaves no
process behind, a SIGKILLed worker makes the server exit non-zero naming the rank; an aborted request frees its
KV blocks on rank 0 without a step the workers take part in."""
from __future__ import annotations

import os
import signal
import time

import pytest

from gh200rt.distributed.launch import usable_cores
from gh200rt.sampling_params import SamplingParams
from tests.distributed.rank_children import rank_processes_of
from tests.distributed.tiny_tp_models import save_tp_tiny, tp_llm

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")
PROMPT = [5, 9, 33, 71, 100, 4]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_tp_tiny("llama-gqa", str(tmp_path_factory.mktemp("llama-gqa")))


def start_server(path: str):
    from tests.server.helpers import ServerProcess
    return ServerProcess("gh200rt.serve", ["--model", path, "--dtype", "float32", "--num-kv-blocks", "48",
                                           "--max-model-len", "128", "--tensor-parallel-size", "2"])


def workers_of(pid: int) -> list:
    return rank_processes_of(pid)


def completion_tokens(server) -> list[int]:
    import httpx
    r = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 0,
        "return_tokens_as_token_ids": True})
    assert r.status_code == 200, r.text
    return [int(t.split(":")[1]) for t in r.json()["choices"][0]["logprobs"]["tokens"]]


def test_served_tokens_equal_tp1_and_sigterm_leaves_no_process(llama):
    import psutil
    single = tp_llm(llama, 1)
    expected = single.generate([PROMPT], SamplingParams(temperature=0, max_tokens=MAX_TOKENS))[0].outputs[0].token_ids
    single.engine.close()
    server = start_server(llama)
    try:
        assert completion_tokens(server) == list(expected)
        children = psutil.Process(server.proc.pid).children(recursive=True)
        assert len(workers_of(server.proc.pid)) == 1
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0, server.read_log()[-3000:]
        print(f"SIGTERM: exited in {time.monotonic() - started:.2f}s")
        _, alive = psutil.wait_procs(children, timeout=5)
        assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"
    finally:
        server.stop()


def test_killed_worker_makes_the_server_exit_naming_the_rank(llama):
    server = start_server(llama)
    try:
        (worker,) = workers_of(server.proc.pid)
        started = time.monotonic()
        os.kill(worker.pid, signal.SIGKILL)
        code = server.proc.wait(10)
        seconds = time.monotonic() - started
        log = server.read_log()
        print(f"server exited {code} {seconds:.2f}s after the worker's SIGKILL")
        assert code != 0 and seconds < 10
        assert "tensor-parallel rank 1 failed: its process was killed by SIGKILL" in log, log[-3000:]
    finally:
        server.stop()


def test_abort_frees_kv_on_rank_0_without_a_step(llama):
    llm = tp_llm(llama, 2)
    engine = llm.engine
    sent = []
    send = engine.runner.step_sender
    engine.runner.step_sender = lambda step: (sent.append(step), send(step))
    try:
        free = engine.kv.pool.num_free
        engine.add_request("r", None, SamplingParams(temperature=0, max_tokens=50), prompt_token_ids=list(range(3, 40)))
        engine.step()
        assert engine.kv.pool.num_free < free and len(sent) == 1
        engine.abort("r")
        assert engine.kv.pool.num_free == free and len(sent) == 1     # freed at once; no step sent for it
        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=4))[0]   # the workers follow on
        assert len(out.outputs[0].token_ids) == 4 and len(sent) == 5
    finally:
        engine.close()
