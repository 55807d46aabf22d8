"""SmolLM2 engines on each CPU compute route, whatever this CPU's default, and what a request's first step computed.

Routes (``platform/cpu_features.py``): ``fp32`` (``--dtype float32``), ``bf16`` (``--dtype bfloat16``: oneDNN's bf16
linears where oneDNN can run them) and ``fp16`` (float32 activations, fp16 linear weights through fbgemm and the
native fp16 linear; forced here, as on an AVX2 host without bf16 ``--dtype auto`` picks it; with the shipped GGUF
the resident linears also keep its Q4_1 / Q8_0 blocks for single rows).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine import bootstrap
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.kernels.quant import fbgemm_fp16_available
from gh200rt.platform import cpu_features
from gh200rt.sampling_params import SamplingParams

ROUTES = ("fp32", "bf16", "fp16")
_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float32"}


def skip_unless_route_runs(route: str) -> None:
    if route == "bf16" and cpu_features.route_for("bfloat16").linear_format is None:
        pytest.skip("oneDNN cannot run bf16 linears on this CPU: the bf16 route is never chosen here")
    if route == "fp16" and not fbgemm_fp16_available():
        pytest.skip("fbgemm's fp16 GEMM is not in this torch: the fp16 route is never chosen here")


@contextlib.contextmanager
def route_llm(route: str, **options) -> Iterator[LLM]:
    """An LLM over SmolLM2 (the shipped GGUF) on ``route``, closed on leaving; ``options``: engine options (a
    small KV pool and context unless given: tests build several engines on a shared machine)."""
    skip_unless_route_runs(route)
    options = {"max_model_len": 256, "num_kv_blocks": 96, **options}
    with pytest.MonkeyPatch.context() as patch:
        if route == "fp16":
            patch.setattr(bootstrap, "route_for", lambda flag: cpu_features._ROUTES["fp16"])
        config = EngineConfig.from_kwargs(model="smollm2-135m", dtype=_DTYPE[route], **options)
        engine = LLMEngine.from_config(config)
    try:
        yield LLM.from_engine(engine)
    finally:
        engine.close()


def first_step_logits(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[list[int], torch.Tensor]:
    """The tokens ``prompt`` generates alone, and the logits its first output token was sampled from."""
    runner = llm.engine.runner
    run, seen = runner.run, []

    def recording(out):
        logits = run(out)
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
