"""SmolLM2 engines on a forced CPU route (the ``cpu_route`` fixture, tests/cpu_routes.py), and what a request's
first step computed. The model is the ``short_smollm2`` fixture's (SmolLM2's first four blocks, tests/conftest.py)
or the whole shipped GGUF."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams


@contextlib.contextmanager
def route_llm(route, model: str, **options) -> Iterator[LLM]:
    """An LLM over ``model`` (a SmolLM2 GGUF) on ``route`` (a ``TestRoute``), closed on leaving; ``options``: engine
    options (a small KV pool and context unless given: tests build several engines on a shared machine)."""
    options = {"max_model_len": 256, "num_kv_blocks": 96, **route.options, **options}
    engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=model, **options))
    try:
        yield LLM.from_engine(engine)
    finally:
        engine.close()


def first_step_logits(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[list[int], torch.Tensor]:
    """The tokens ``prompt`` generates alone, and the logits its first output token was sampled from."""
    runner = llm.engine.runner
    run, seen = runner.run, []

    def recording(out, *fed):
        logits = run(out, *fed)
        if logits.sample_logits.numel():
            seen.append(logits.sample_logits.clone())
        return logits
    runner.run = recording
    try:
        out = llm.generate([prompt], params)[0]
    finally:
        del runner.run
    assert seen and seen[0].shape[0] == 1, "the request ran alone, so its first sampling step has one row"
    return list(out.outputs[0].token_ids), seen[0][0]


def describe_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    diff = (got - want).abs()
    return f"{int((diff > 0).sum())} of {diff.numel()} logits differ, by up to {diff.max().item():.3g}"


def sampled_logits(llm: LLM, requests: list[tuple], target: str) -> tuple[list[int], list[torch.Tensor]]:
    """Run ``requests`` ((id, prompt, params, the step before which it arrives[, add_request options such as
    ``lora_request``])) to the end; the tokens of request ``target`` and the logits of each of its sampling
    steps."""
    engine, runner = llm.engine, llm.engine.runner
    run, rows = runner.run, []

    def recording(out, *fed):
        ids = [item.seq.seq_id for item in out.scheduled if item.samples]   # the rows that sample, in order
        logits = run(out, *fed)
        if f"{target}#0" in ids:
            rows.append(logits.sample_logits[ids.index(f"{target}#0")].clone())
        return logits
    runner.run = recording
    tokens, step = {}, 0
    try:
        while any(r[3] >= step for r in requests) or engine.has_unfinished_requests():
            for request_id, prompt, params, arrival, *options in requests:
                if arrival == step:
                    engine.add_request(request_id, None, params, prompt_token_ids=prompt, **(options or [{}])[0])
            for out in engine.step():
                tokens[out.request_id] = list(out.outputs[0].token_ids)
            step += 1
    finally:
        del runner.run
    return tokens[target], rows
