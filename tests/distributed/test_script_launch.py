"""``LLM(..., tensor_parallel_size=2)`` at the top level of a plain script, with no ``if __name__ == "__main__":``
guard, as vLLM's examples are often copied: the workers start without importing the script, so it runs once, its
tokens are TP=1's, and it exits leaving no worker behind."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gh200rt.distributed.launch import usable_cores
from gh200rt.sampling_params import SamplingParams
from tests.distributed.tiny_tp_models import save_tp_tiny, tp_llm

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")

PROMPT = [5, 9, 33, 71, 100, 4]
MAX_TOKENS = 6


def test_an_unguarded_script_runs_once_and_gets_tp1s_tokens(tmp_path):
    path = save_tp_tiny("llama-gqa", str(tmp_path / "llama"))
    single = tp_llm(path, 1)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    expected = list(single.generate([PROMPT], greedy)[0].outputs[0].token_ids)
    single.engine.close()
    script = tmp_path / "plain_script.py"
    script.write_text(textwrap.dedent(f"""\
        import os
        print("top level ran in", os.getpid(), flush=True)
        from gh200rt import LLM, SamplingParams
        llm = LLM({path!r}, dtype="float32", num_kv_blocks=48, max_model_len=128, tensor_parallel_size=2)
        out = llm.generate([{PROMPT!r}], SamplingParams(temperature=0, max_tokens={MAX_TOKENS}))
        print("tokens", list(out[0].outputs[0].token_ids), flush=True)
        """))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert run.stdout.count("top level ran") == 1, log[-3000:]
    assert f"tokens {expected}" in run.stdout, log[-3000:]
    assert "bootstrapping phase" not in log
