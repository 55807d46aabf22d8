"""What the engine returns: one ``RequestOutput`` per request per step in which it advanced.

``text`` / ``token_ids`` are cumulative; ``delta_*`` hold only what this step added (what a
streaming server sends). A choice's ``finish_reason`` is set exactly once, on its last output.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int                      # 1 = most likely
    decoded_token: str | None = None


# One entry per token: {token_id: Logprob}, always holding the chosen token plus the top-k.
TokenLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None          # None while running; "stop", "length" or "abort"
    stop_reason: int | str | None = None      # the stop string or stop token id that ended it
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[TokenLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


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
