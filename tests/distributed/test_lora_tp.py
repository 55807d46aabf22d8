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
from tests.lora.test_lora_parity import tiny as lora_tiny  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(lora_tiny):  # noqa: F811
    """The parity tests' model and adapters, and one more that no --lora-modules names (loaded at request time)."""
    late = write_peft_adapter(str(lora_tiny["root"] / "late"), lora_tiny["hf"], r=2, alpha=4,
                              targets=(*ATTENTION, "gate_proj"), seed=4)
    return {**lora_tiny, "late": late}


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
