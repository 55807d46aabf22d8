"""One sequence the engine generates: its tokens, KV progress, block table and stopping state.

A user request with ``n`` choices becomes ``n`` sequences sharing a ``group_id``; choice 0 computes
the prompt and the others fork its full prompt blocks (``share_prompt_from``). An embedding request is one
sequence with ``pooling`` set ("LAST" or "MEAN", engine/pooling.py): it prefills its prompt and samples nothing.
"""
from __future__ import annotations

import enum

import torch

from gh200rt.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, seq_id: str, group_id: str, index: int, prompt_token_ids: list[int],
                 params: SamplingParams, arrival: int, eos_token_ids: frozenset[int] = frozenset(),
                 max_model_len: int = 1 << 30, pooling: str | None = None):
        self.seq_id = seq_id
        self.group_id = group_id
        self.index = index
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self._all = list(prompt_token_ids)
        self.params = params
        self.pooling = pooling
        self.arrival = arrival
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.block_row = None                     # kv.block_row.BlockRow: block_ids as int32 for the step inputs
        self.block_hashes: list[int] = []
        self.host_blocks: list = []                # host KV tier blocks adopted, waiting for device blocks
        self.host_reads: list = []                 # host KV tier blocks its table names, read in place
        self.spec_drafts: list[int] = []           # tokens drafted for the next step (speculative decoding)
        self.spec_draft_probs = None               # a draft model's distributions they were drawn from ([k, V])
        self.draft_computed = 0                    # positions whose draft-model KV is valid
        self.num_cached_tokens = 0                # prompt tokens reused from the prefix cache
        self.num_preemptions = 0
        self.share_prompt_from: "Sequence | None" = None
        self.lora = None                          # the LoRA adapter's gh200rt.lora.registry.AdapterEntry, or None
        self.lora_id = 0                          # its id (0: the base model): the scheduler bounds distinct ones
        self.cache_salt = 0                       # kv_manager.salt_of(lora_id, the request's salt): its own KV blocks
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        # Seeded from (seed, choice index) only, so the tokens never depend on the batch.
        self.seed: int | None = None if params.seed is None else (params.seed * 1_000_003 + index) % (2**63)
        self._generator: torch.Generator | None = None
        self.output_logprobs: list = []
        self.penalty_counts = None                # engine.penalties.PenaltyCounts, made on its first penalised step
        self.cumulative_logprob = 0.0
        self.grammar = None                       # gh200rt.structured.SequenceGrammar of a constrained request
        self.first_token_time: float | None = None  # perf_counter stamps of the first and latest output token
        self.last_token_time: float | None = None

    def generator_on(self, device: torch.device) -> torch.Generator:
        """This sequence's own generator, on the device its logits live on (created at first draw)."""
        assert self.seed is not None, "only seeded sequences have their own generator"
        if self._generator is None:
            self._generator = torch.Generator(device=device).manual_seed(self.seed)
        assert self._generator.device == device, "a sequence samples on one device"
        return self._generator

    @property
    def all_token_ids(self) -> list[int]:
        return self._all

    @property
    def num_tokens(self) -> int:
        return len(self._all)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def computes_whole_prompt(self) -> bool:
        """Every prompt position must be computed (none taken from the prefix cache): to score each position, or to
        pool them all."""
        return self.params.prompt_logprobs is not None or self.pooling == "MEAN"

    @property
    def prompt_only(self) -> bool:
        """It computes its prompt and at most one token: its cached prefix is read once."""
        return self.pooling is not None or self.params.max_tokens == 1

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < self.num_tokens - 1

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all.append(token_id)

    def check_token_stop(self, token_id: int) -> bool:
        """Finish on max_tokens, a stop token id, EOS or the context limit; True if finished."""
        p = self.params
        n_out = len(self.output_token_ids)
        if n_out >= p.min_tokens:
            if token_id in p.stop_token_ids:
                return self.finish("stop", token_id)
            if not p.ignore_eos and token_id in self.eos_token_ids:
                return self.finish("stop", None)
        if p.max_tokens is not None and n_out >= p.max_tokens:
            return self.finish("length")
        if self.num_tokens >= self.max_model_len:
            return self.finish("length")
        return False

    def finish(self, reason: str, stop_reason: int | str | None = None) -> bool:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        return True
