"""What the engine returns: one ``RequestOutput`` per request per step in which it advanced.

``text`` / ``token_ids`` are cumulative; ``delta_*`` hold only what this step added (what a
streaming server sends). A choice's ``finish_reason`` is set exactly once, on its last output.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int                      # 1 = most likely
    decoded_token: str | None = None


# One entry per token: {token_id: Logprob}, always holding the chosen token plus the top-k.
TokenLogprobs = dict[int, Logprob]


class CompletionOutput:
    """One choice at one step. ``text``, ``token_ids`` and ``logprobs`` are cumulative; ``snapshot`` builds them
    on first read from the sequence's append-only lists cut at this step's length, so reporting a step costs
    what the step added: copying them every step made a long output's reports quadratic (64 sequences of 4,096
    tokens copied 262,144 ids per step)."""

    __slots__ = ("index", "cumulative_logprob", "finish_reason", "stop_reason", "delta_text", "delta_token_ids",
                 "delta_logprobs", "_text", "_text_len", "_token_ids", "_ids_len", "_logprobs", "_logprobs_len")

    def __init__(self, index: int, text: str = "", token_ids: list[int] | None = None,
                 cumulative_logprob: float | None = None, logprobs: list[TokenLogprobs] | None = None,
                 finish_reason: str | None = None, stop_reason: int | str | None = None, delta_text: str = "",
                 delta_token_ids: list[int] | None = None, delta_logprobs: list[TokenLogprobs] | None = None):
        self.index = index
        self.cumulative_logprob = cumulative_logprob
        self.finish_reason = finish_reason          # None while running; "stop", "length" or "abort"
        self.stop_reason = stop_reason              # the stop string or stop token id that ended it
        self.delta_text = delta_text
        self.delta_token_ids = [] if delta_token_ids is None else delta_token_ids
        self.delta_logprobs = delta_logprobs
        self._text, self._text_len = text, None
        self._token_ids, self._ids_len = ([] if token_ids is None else token_ids), None
        self._logprobs, self._logprobs_len = logprobs, None

    @classmethod
    def snapshot(cls, index: int, text_pieces: list[str], text_len: int, token_ids: list[int], logprobs: list | None,
                 **fields) -> CompletionOutput:
        """The first ``text_len`` characters of ``text_pieces`` joined, ``token_ids`` and ``logprobs`` as they are now
        (the lists only ever grow: their current lengths are the snapshot), copied only if read."""
        out = cls(index, **fields)
        out._text, out._text_len = (text_pieces, len(text_pieces)), text_len
        out._token_ids, out._ids_len = token_ids, len(token_ids)
        if logprobs is not None:
            out._logprobs, out._logprobs_len = logprobs, len(logprobs)
        return out

    @property
    def text(self) -> str:
        if self._text_len is not None:
            pieces, count = self._text
            self._text, self._text_len = "".join(pieces[:count])[:self._text_len], None
        return self._text

    @property
    def token_ids(self) -> list[int]:
        if self._ids_len is not None:
            self._token_ids, self._ids_len = self._token_ids[:self._ids_len], None
        return self._token_ids

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        if self._logprobs_len is not None:
            self._logprobs, self._logprobs_len = self._logprobs[:self._logprobs_len], None
        return self._logprobs

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    _FIELDS = ("index", "text", "token_ids", "cumulative_logprob", "logprobs", "finish_reason", "stop_reason",
               "delta_text", "delta_token_ids", "delta_logprobs")

    def __eq__(self, other) -> bool:
        if not isinstance(other, CompletionOutput):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._FIELDS)

    def __repr__(self) -> str:
        return "CompletionOutput(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self._FIELDS) + ")"


@dataclass
class RequestMetrics:
    """A request's life in ``time.perf_counter`` seconds (vLLM's ``RequestOutput.metrics``): queued from
    ``arrival_time`` to ``first_scheduled_time`` (its first step, prefill chunk or cache hit), prefill until
    ``first_token_time``, decode until ``last_token_time``; ``finished_time`` once every choice ended."""
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[TokenLogprobs | None] | None = None   # first entry None (no context)
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None

    # The first choice, for the common n == 1 case: ``llm.generate(...)[i].text``.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """What an embedding request returns, once, when its input is prefilled (vLLM's names:
    ``outputs.embedding``)."""
    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True
    metrics: RequestMetrics | None = None
