"""LoRA under tensor parallelism: rank 0 puts adapters in slots and sends the workers each step's slot loads and
slots; every rank holds its slice of each adapter (gh200rt/distributed/worker_lora.py). Two ranks give the tokens and
logprobs of one rank (float32, CPU/gloo) for two adapters and the base model in one batch, for an adapter loaded at
request time, and for one slot reused by two adapters in turn."""
from __future__ import annotations

import pytest

from gh200rt import LLM
from gh200rt.lora.request import LoRARequest
from tests.lora.peft_files import ATTENTION, write_peft_adapter
from tests.lora.test_lora_parity import GREEDY, PROMPTS, tokens_and_logprobs
from tests.model.tiny_checkpoints import save_tiny

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_tp")
    hf = save_tiny("llama3-gqa-untied", str(root / "model"))
    sql = write_peft_adapter(str(root / "sql"), hf, r=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"), seed=1)
    chat = write_peft_adapter(str(root / "chat"), hf, r=8, alpha=16, seed=2, use_rslora=True)
    late = write_peft_adapter(str(root / "late"), hf, r=2, alpha=4, targets=(*ATTENTION, "gate_proj"), seed=4)
    return {"path": str(root / "model"), "sql": sql, "chat": chat, "late": late}


def run(tiny, tensor_parallel_size: int, max_loras: int = 2):
    llm = LLM(model=tiny["path"], dtype="float32", max_model_len=128, num_kv_blocks=96, block_size=4,
              enable_lora=True, lora_modules=(f"sql={tiny['sql']}", f"chat={tiny['chat']}"), max_loras=max_loras,
              max_lora_rank=8, tensor_parallel_size=tensor_parallel_size)
    try:
        names = ["base", "sql", "chat", "late"]
        prompts = [PROMPTS["sql"], PROMPTS["sql"], PROMPTS["chat"], PROMPTS["chat"][::-1]]
        requests = [None, "sql", "chat", LoRARequest("late", 9, tiny["late"])]
        outs = llm.generate(prompts, GREEDY, lora_request=requests)
        return {n: tokens_and_logprobs(o) for n, o in zip(names, outs)}, llm.engine.lora.slot_loads
    finally:
        llm.engine.close()


@pytest.mark.parametrize("max_loras", [2, 1], ids=["two-slots", "one-slot-reused"])
def test_two_ranks_serve_adapters_like_one(tiny, max_loras):
    want, _ = run(tiny, 1, max_loras)
    got, loads = run(tiny, 2, max_loras)
    assert loads >= 3, "every adapter went through a slot"
    for name in want:
        worst = max(abs(a - b) for a, b in zip(got[name][1], want[name][1]))
        print(f"{name}: TP=2 tokens {got[name][0]} (TP=1 {want[name][0]}), worst logprob gap {worst:.2e}")
        assert got[name][0] == want[name][0], name
        assert worst < 1e-4, name
    assert want["sql"][0] != want["base"][0], "the adapter changes this prompt's tokens: the ranks' deltas count"
