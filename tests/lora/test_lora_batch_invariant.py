"""--batch-invariant with LoRA: a request under an adapter gets the same logits, bit for bit, alone and in a batch
that changes every few steps (the base model and both adapters beside it, its adapter's rows split in several
runs), because the adapter's delta follows the base linear's row blocks (gh200rt/lora/grouped.py)."""
from __future__ import annotations

import random

import torch

from gh200rt.sampling_params import SamplingParams
from tests.engine.route_engines import describe_difference, sampled_logits
from tests.lora.test_lora_parity import make_llm, tiny  # noqa: F401  (the module's fixture)


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(length)]


def _run(llm, requests, target: str) -> tuple[list[int], list[torch.Tensor]]:
    """``requests``: (id, prompt, adapter name or None, the step before which it arrives)."""
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    return sampled_logits(llm, [(rid, prompt, params, arrival, {"lora_request": adapter})
                                for rid, prompt, adapter, arrival in requests], target)


def test_a_request_under_an_adapter_gets_its_bits_alone_and_in_any_batch(tiny):  # noqa: F811
    me = ("me", _prompt(23, 1), "chat")
    others = [("a", _prompt(5, 2), "chat", 0), ("b", _prompt(31, 3), None, 0), ("c", _prompt(12, 4), "sql", 1),
              ("d", _prompt(40, 5), "chat", 3), ("e", _prompt(2, 6), None, 5)]
    llm = make_llm(tiny, batch_invariant=True, enable_prefix_caching=False)
    try:
        want_tokens, want = _run(llm, [(*me, 0)], "me")
        got_tokens, got = _run(llm, [*others[:2], (*me, 1), *others[2:]], "me")
    finally:
        llm.engine.close()
    assert got_tokens == want_tokens
    assert len(got) == len(want) == 10
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"step {step}: {describe_difference(g, w)}"


def test_async_scheduling_with_adapters_gets_the_synchronous_tokens(tiny):  # noqa: F811
    """Steps launched ahead carry the step's adapter slots as synchronous ones do; adapters that arrive, share
    the batch and leave (two slots, three names with the base model) give the same tokens either way."""
    requests = [("a", _prompt(5, 2), "chat", 0), ("b", _prompt(31, 3), None, 0), ("c", _prompt(12, 4), "sql", 1),
                ("d", _prompt(9, 5), "chat", 3), ("e", _prompt(2, 6), None, 5)]
    tokens = {}
    for mode in (False, True):
        llm = make_llm(tiny, async_scheduling=mode)
        try:
            tokens[mode] = {rid: _run(llm, requests, rid)[0] for rid in ("a", "c", "e")}
            launched = llm.engine.stats().steps_launched_ahead
        finally:
            llm.engine.close()
    assert tokens[True] == tokens[False]
    assert launched > 0
