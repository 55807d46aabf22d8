"""LoRA under tensor parallelism: rank 0 puts adapters in slots and sends the workers each step's slot loads and
slots; every rank holds its slice of each adapter (gh200rt/distributed/worker_lora.py). Two ranks give the tokens and
logprobs of one rank (float32, CPU/gloo) for two adapters and the base model in one batch, for an adapter loaded at
request time, and for one slot reused by two adapters in turn."""
from __future__ import annotations

import pytest

from gh200rt import LLM
from gh200rt.lora.request import LoRARequest
from tests.lora.peft_files import ATTENTION, LATENT, MLP, write_peft_adapter
from tests.lora.test_lora_parity import GREEDY, PROMPTS, tokens_and_logprobs
from tests.lora.test_lora_parity import tiny as lora_tiny  # noqa: F401 (fixture)
from tests.model.tiny_checkpoints import save_tiny

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


def test_two_ranks_serve_latent_attention_adapters_like_one(tmp_path):
    """DeepSeek-V3's shape: each rank holds its heads' rows of q_b_proj and kv_b_proj's adapters (the kv_b_proj
    delta taken through the absorbed products) and its value columns of o_proj's; q_a_proj and kv_a_proj_with_mqa's
    whole."""
    hf = save_tiny("deepseek-v3", str(tmp_path / "model"))
    full = write_peft_adapter(str(tmp_path / "full"), hf, r=4, alpha=8, targets=(*LATENT, *MLP), seed=1,
                              layer_targets=lambda layer: LATENT + (MLP if layer == 0 else ()))
    prompts = [PROMPTS["sql"], PROMPTS["sql"], PROMPTS["chat"]]
    results = {}
    for ranks in (1, 2):
        llm = LLM(model=str(tmp_path / "model"), dtype="float32", max_model_len=128, num_kv_blocks=96, block_size=4,
                  enable_lora=True, lora_modules=(f"full={full}",), max_loras=1, max_lora_rank=8,
                  tensor_parallel_size=ranks)
        try:
            outs = llm.generate(prompts, GREEDY, lora_request=[None, "full", "full"])
            results[ranks] = [tokens_and_logprobs(o) for o in outs]
        finally:
            llm.engine.close()
    for (want, want_lp), (got, got_lp) in zip(results[1], results[2]):
        assert got == want
        assert max(abs(a - b) for a, b in zip(got_lp, want_lp)) < 1e-4
    assert results[1][0][0] != results[1][1][0], "the adapter changes this prompt's tokens: the ranks' deltas count"
