"""Requests into the engine: prompts tokenized and checked, parameters validated against the model, each
request's sequences handed to the scheduler; aborts; the LoRA adapters a request may run under.

``RequestIntake`` is a part of ``LLMEngine`` (engine.py), kept apart because it is its own concept: everything
here happens between steps and raises ``ValueError`` with an actionable message for bad user input, before the
scheduler sees anything. A generation request becomes a ``RequestState`` (request_state.py) with ``n``
sequences; one with ``PoolingParams`` an ``EmbeddingState`` (pooling.py). The methods here use the engine's
attributes (``tokenizer``, ``scheduler``, ``requests``, ``lora``, ``max_model_len``...).
"""
from __future__ import annotations

from gh200rt.engine.detokenizer import IncrementalDetokenizer
from gh200rt.engine.pooling import EmbeddingState
from gh200rt.engine.request_state import RequestState
from gh200rt.kv.kv_manager import salt_of
from gh200rt.lora.request import LoRARequest
from gh200rt.pooling_params import PoolingParams
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence
from gh200rt.structured.reasoning_gate import GatedGrammar


class RequestIntake:
    def add_request(self, request_id: str, prompt: str | None, params: SamplingParams | PoolingParams | None = None,
                    prompt_token_ids: list[int] | None = None, lora_request: LoRARequest | str | None = None,
                    cache_salt: str | None = None) -> None:
        """A generation request, or with ``PoolingParams`` an embedding request (vLLM's convention).
        ``lora_request``: the adapter to run under (a loaded adapter's name, or vLLM's ``LoRARequest``, whose
        path is loaded under its name first if the name is new); None: the base model. ``cache_salt`` (vLLM's):
        the request shares prefix-cache blocks only with requests of the same salt (and adapter)."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running; use a unique id")
        adapter = self._adapter_for(lora_request) if lora_request is not None else None
        prompt_token_ids = self._prompt_ids(prompt, prompt_token_ids)
        if isinstance(params, PoolingParams):
            if cache_salt is not None:
                raise ValueError("embedding requests take no cache_salt; leave it out")
            if adapter is not None:
                raise ValueError("embeddings under a LoRA adapter are not supported; ask the base model for them")
            return self._add_embedding(request_id, prompt_token_ids, params)
        params = params.with_vocab(self.vocab_size).with_tokenizer(
            lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        self._validate(prompt_token_ids, params)
        state = RequestState(request_id, prompt, prompt_token_ids, params)
        grammars = [self.grammars.new(params.structured_output) for _ in range(params.n)] \
            if params.structured_output is not None else [None] * params.n
        if params.reasoning_gate is not None:
            grammars = [GatedGrammar(grammar, params.reasoning_gate) for grammar in grammars]
        owner = None
        for index in range(params.n):
            seq = Sequence(f"{request_id}#{index}", request_id, index, prompt_token_ids, params, self._arrivals,
                           self.eos_token_ids, self.max_model_len)
            seq.grammar = grammars[index]
            if adapter is not None:
                seq.lora, seq.lora_id = adapter, adapter.id
            seq.cache_salt = salt_of(seq.lora_id, cache_salt)
            self._arrivals += 1
            seq.share_prompt_from = owner
            owner = owner or seq
            state.seqs.append(seq)
            state.detoks.append(IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                                       params.stop, params.include_stop_str_in_output))
            self.scheduler.add(seq)
        self.requests[request_id] = state
        self.prompt_tokens += len(prompt_token_ids)

    # ---- LoRA adapters --------------------------------------------------------------------------
    def _adapter_for(self, lora_request: LoRARequest | str):
        if self.lora is None:
            raise ValueError("this engine serves no LoRA adapters; start it with --enable-lora (enable_lora=True)")
        return self.lora.entry_for(lora_request)

    def add_lora(self, name: str, path: str, base_model_name: str | None = None, adapter=None):
        """Register an adapter (``adapter``: what ``self.lora.read(path)`` returned, read off this thread)."""
        if self.lora is None:
            raise ValueError("this engine serves no LoRA adapters; start it with --enable-lora")
        return self.lora.add(name, path, base_model_name, adapter)

    def remove_lora(self, name: str):
        """Unregister ``name`` (``UnknownAdapter`` if none); its running requests finish with it."""
        if self.lora is None:
            raise ValueError("this engine serves no LoRA adapters; start it with --enable-lora")
        return self.lora.remove(name)

    # ---- prompts --------------------------------------------------------------------------------
    def _prompt_ids(self, prompt: str | None, prompt_token_ids: list[int] | None) -> list[int]:
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("give a prompt string or prompt_token_ids")
            try:
                prompt_token_ids = list(self.tokenizer.encode(prompt))
            except (TypeError, ValueError, UnicodeError) as e:  # e.g. unpaired surrogates in the text
                raise ValueError(f"the prompt cannot be tokenized: {e}") from e
        ids = [int(t) for t in prompt_token_ids]
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        return ids

    def _add_embedding(self, request_id: str, ids: list[int], params: PoolingParams) -> None:
        params.check_dimensions(self.arch.hidden_size)
        if len(ids) > self.max_model_len:
            raise ValueError(f"the input has {len(ids)} tokens but max_model_len is {self.max_model_len}; shorten it, "
                             f"pass truncate_prompt_tokens, or raise --max-model-len")
        # default SamplingParams: what the scheduler reads of any sequence (no prompt logprobs); nothing samples
        seq = Sequence(f"{request_id}#0", request_id, 0, ids, SamplingParams(max_tokens=None), self._arrivals,
                       max_model_len=self.max_model_len, pooling=self.config.model.pooling_type)
        self._arrivals += 1
        self.scheduler.add(seq)
        self.requests[request_id] = EmbeddingState(request_id, seq, params)
        self.prompt_tokens += len(ids)

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        bad = [t for t in params.stop_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        for name, listed in (("logit_bias", params.logit_bias), ("logprob_token_ids", params.logprob_token_ids),
                             ("allowed_token_ids", params.allowed_token_ids)):
            bad = [t for t in (listed or ()) if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"{name} token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        bound = self.config.model.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is not None and bound != -1 and asked > bound:
                raise ValueError(f"{name} asks for {asked} logprobs per token but at most {bound} are returned "
                                 f"(--max-logprobs); ask for fewer or raise --max-logprobs")
        want = len(ids) + (params.max_tokens or 1)
        if want > self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens and max_tokens is {params.max_tokens}: "
                             f"{want} tokens exceed max_model_len {self.max_model_len}; shorten the prompt, "
                             f"lower max_tokens, or raise --max-model-len")

    def abort(self, request_id: str) -> None:
        state = self.requests.pop(request_id, None)
        if state is None:
            return
        for seq in state.seqs:
            if not seq.is_finished or seq.block_ids:
                seq.finish("abort")
                self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)
