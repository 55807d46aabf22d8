"""One HTTP generation request = one engine request per prompt, merged into one event stream.

``GenerationRun`` is made when the request is admitted (it holds the request's admission ticket),
submits the prompts, waits until the engine accepted all of them (so input errors become a 400
before any byte is sent), then yields per-choice deltas. Whatever ends the run, normally or early
(client disconnect, cancellation, error), ends in ``close()``: it aborts every unfinished engine
request, which frees their KV blocks at once, and gives the admission slots back.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from gh200rt.serve.admission import Ticket
from gh200rt.serve.async_engine import AsyncEngine
from gh200rt.serve.errors import APIError
from gh200rt.serve.protocol import ParsedRequest


@dataclass
class ChoiceDelta:
    index: int                     # global choice index: prompt_index * n + choice
    text: str
    token_ids: list[int]
    logprobs: list | None
    finish_reason: str | None
    stop_reason: object = None


class GenerationRun:
    def __init__(self, engine: AsyncEngine, kind: str, parsed: ParsedRequest, metrics, ticket: Ticket,
                 lora_name: str | None = None):
        """``lora_name``: the LoRA adapter the request's ``model`` names (None: the base model)."""
        self.engine = engine
        self.lora_name = lora_name
        self.ticket = ticket
        self.kind = kind
        self.parsed = parsed
        self.metrics = metrics
        self.ids: list[str] = []                            # one engine request per prompt, from start()
        self.prompt_index: dict[str, int] = {}
        self.sink: asyncio.Queue = asyncio.Queue()
        self.unfinished: set[str] = set()
        self.prompt_token_ids: dict[int, list[int]] = {}
        self.prompt_logprobs: dict[int, list] = {}          # per prompt, when echo asked for logprobs
        self.cached_tokens: dict[int, int] = {}             # per prompt: tokens reused from the prefix cache
        self.completion_tokens_of: dict[int, int] = {}      # per choice
        self.completion_tokens = 0
        self.arrival = time.monotonic()
        self._last = None

    async def start(self) -> None:
        """Submit the (tokenized) prompts and wait until the engine accepted every one."""
        self.metrics.count("requests_received_total")
        self.ids = [self.engine.new_request_id(self.kind) for _ in self.parsed.prompts]
        self.prompt_index = {rid: i for i, rid in enumerate(self.ids)}
        try:
            for rid, (text, ids) in zip(self.ids, self.parsed.prompts):
                self.engine.add(rid, text, ids, self.parsed.params, sink=self.sink, lora_name=self.lora_name,
                                cache_salt=self.parsed.cache_salt)
                self.unfinished.add(rid)
            waiting = set(self.unfinished)
            while waiting:
                kind, rid, payload = await self.sink.get()
                if kind == "error":
                    raise payload
                assert kind == "ok", kind
                waiting.discard(rid)
        except APIError:
            self.metrics.count("requests_rejected_total")
            self.close(count_abort=False)
            raise
        except asyncio.CancelledError:          # the client left before the engine accepted every prompt
            self.close()
            raise

    async def deltas(self):
        """Yields lists of ChoiceDelta until every prompt's choices finished."""
        n = self.parsed.params.n
        while self.unfinished:
            kind, rid, payload = await self.sink.get()
            if kind == "error":
                raise payload
            if kind != "output":
                continue
            p = self.prompt_index[rid]
            self.prompt_token_ids[p] = payload.prompt_token_ids
            self.cached_tokens[p] = payload.num_cached_tokens
            if payload.prompt_logprobs is not None:
                self.prompt_logprobs[p] = payload.prompt_logprobs
            now = time.monotonic()
            new_tokens = sum(len(c.delta_token_ids) for c in payload.outputs)
            if new_tokens:
                if self._last is None:
                    self.metrics.observe(self.metrics.ttft, now - self.arrival)
                else:
                    self.metrics.observe(self.metrics.itl, now - self._last)
                self._last = now
                self.completion_tokens += new_tokens
                self.metrics.count("generation_tokens_total", new_tokens)
            batch = [ChoiceDelta(p * n + c.index, c.delta_text, c.delta_token_ids, c.delta_logprobs,
                                 c.finish_reason, c.stop_reason)
                     for c in payload.outputs if c.delta_text or c.delta_token_ids or c.finish_reason]
            if payload.finished:
                self.unfinished.discard(rid)
                self.engine.finished(rid)
                self.metrics.request_finished(payload, self.parsed.params)
            if batch:
                yield batch
        self.metrics.observe(self.metrics.e2e, time.monotonic() - self.arrival)
        self.metrics.count("requests_success_total")
        self.metrics.count("prompt_tokens_total", self.prompt_tokens)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_token_ids.values())

    @property
    def num_cached_tokens(self) -> int:
        return sum(self.cached_tokens.values())

    def close(self, count_abort: bool = True) -> None:
        """Idempotent: every path that ends the run calls it, some more than once."""
        if self.unfinished and count_abort:
            self.metrics.count("requests_aborted_total")
            for _ in self.unfinished:
                self.metrics.request_aborted()
        for rid in list(self.unfinished):
            self.engine.abort(rid)
        for rid in self.ids:
            self.engine.finished(rid)
        self.unfinished.clear()
        self.ticket.release()

    async def collect(self) -> dict[int, list[ChoiceDelta]]:
        """Non-streaming: gather all deltas per choice (the caller cancels us if the client leaves)."""
        per_choice: dict[int, list[ChoiceDelta]] = {}
        try:
            async for batch in self.deltas():
                for d in batch:
                    per_choice.setdefault(d.index, []).append(d)
            return per_choice
        finally:
            self.close()
