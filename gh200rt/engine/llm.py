"""The offline API: ``LLM(...).generate(prompts, params)``, ``.chat(messages, params)`` and ``.embed(prompts)``.

Built on ``LLMEngine``: every prompt becomes a request, the engine is stepped until all finish,
and results come back in prompt order.
"""
from __future__ import annotations

from typing import Sequence as Seq

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.outputs import EmbeddingRequestOutput, RequestOutput
from gh200rt.pooling_params import PoolingParams
from gh200rt.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str = "smollm2-135m", dtype: str = "auto", max_model_len: int | None = None,
                 block_size: int = 16, num_kv_blocks: int | None = None, enable_prefix_caching: bool = True,
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 2048, **engine_options):
        config = EngineConfig.from_kwargs(
            model=model, dtype=dtype, max_model_len=max_model_len, block_size=block_size,
            num_kv_blocks=num_kv_blocks, enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, **engine_options)
        self.engine = LLMEngine.from_config(config)
        self._counter = 0

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        llm = cls.__new__(cls)
        llm.engine = engine
        llm._counter = 0
        return llm

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 lora_request=None) -> list[RequestOutput]:
        """``lora_request``: vLLM's ``LoRARequest`` (or a loaded adapter's name), one for all prompts or a list with
        one per prompt (None: the base model)."""
        items = _as_prompt_list(prompts)
        params = _params_per_prompt(sampling_params, len(items))
        adapters = list(lora_request) if isinstance(lora_request, (list, tuple)) else [lora_request] * len(items)
        if len(adapters) != len(items):
            raise ValueError(f"got {len(adapters)} lora requests for {len(items)} prompts; give one, or one per prompt")
        ids = []
        for item, p, adapter in zip(items, params, adapters):
            request_id = f"llm-{self._counter}"
            self._counter += 1
            if isinstance(item, str):
                self.engine.add_request(request_id, item, p, lora_request=adapter)
            else:
                self.engine.add_request(request_id, None, p, prompt_token_ids=list(item), lora_request=adapter)
            ids.append(request_id)
        return self._run(ids)

    def embed(self, prompts, pooling_params: PoolingParams | None = None) -> list[EmbeddingRequestOutput]:
        """One pooled, by default L2-normalised, vector per prompt (``outputs[i].outputs.embedding``), pooled as
        ``--pooling-type`` says; prompts are strings or token id lists, as for ``generate``."""
        params = pooling_params or PoolingParams()
        ids = []
        for item in _as_prompt_list(prompts):
            request_id = f"llm-{self._counter}"
            self._counter += 1
            if isinstance(item, str):
                self.engine.add_request(request_id, item, params)
            else:
                self.engine.add_request(request_id, None, params, prompt_token_ids=list(item))
            ids.append(request_id)
        final: dict[str, EmbeddingRequestOutput] = {}
        while len(final) < len(ids):
            for out in self.engine.step():
                if isinstance(out, EmbeddingRequestOutput):
                    final[out.request_id] = out
        return [final[i] for i in ids]

    def chat(self, messages, sampling_params=None, add_generation_prompt: bool = True,
             lora_request=None) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt)
                   for c in conversations]
        return self.generate(prompts, sampling_params, lora_request)

    def _run(self, ids: list[str]) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        finished_choices: dict[str, dict] = {}
        pending = set(ids)
        while pending:
            for out in self.engine.step():
                if out.request_id not in pending or isinstance(out, EmbeddingRequestOutput):
                    continue
                reasons = finished_choices.setdefault(out.request_id, {})
                for c in out.outputs:
                    if c.finish_reason is not None:
                        reasons[c.index] = (c.finish_reason, c.stop_reason)
                if out.finished:
                    for c in out.outputs:
                        c.finish_reason, c.stop_reason = reasons.get(c.index, (c.finish_reason, c.stop_reason))
                    final[out.request_id] = out
                    pending.discard(out.request_id)
        return [final[i] for i in ids]


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("generate() needs at least one prompt")
    if all(isinstance(t, int) for t in prompts):
        return [prompts]
    return prompts


def _params_per_prompt(params, count: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} sampling params for {count} prompts; give one, or one per prompt")
    return params
