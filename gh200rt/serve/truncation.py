"""vLLM's ``truncate_prompt_tokens`` and ``truncation_side``: keep N tokens of a tokenized prompt.

N = -1 means as many as fit: max_model_len less the tokens asked for (``max_tokens``). The default
side is "left", which drops the start of the prompt and keeps its last N tokens; "right" keeps the
first N. An N larger than what fits is a 400, as in vLLM, rather than a prompt that cannot run.
"""
from __future__ import annotations

from dataclasses import dataclass

from gh200rt.serve.errors import bad_request

SIDES = ("left", "right")
AS_MANY_AS_FIT = -1
TRUNCATION_FIELDS = ("truncate_prompt_tokens", "truncation_side")


@dataclass(frozen=True)
class PromptTruncation:
    tokens: int                  # N, or -1 for as many as fit
    side: str = "left"           # "left" keeps the last N tokens, "right" the first N

    def apply(self, ids: list[int], max_model_len: int, max_tokens: int | None) -> list[int]:
        fits = max_model_len - (max_tokens or 0)
        keep = fits if self.tokens == AS_MANY_AS_FIT else self.tokens
        if keep > fits:
            raise bad_request(f"'truncate_prompt_tokens' is {keep} but max_model_len {max_model_len} less max_tokens "
                              f"{max_tokens or 0} leaves room for {fits} prompt tokens; ask for at most {fits} "
                              "(or -1 for as many as fit)", "truncate_prompt_tokens")
        if keep < 1:
            raise bad_request(f"max_tokens {max_tokens} leaves no room for a prompt in max_model_len {max_model_len}; "
                              "lower max_tokens", "max_tokens")
        if len(ids) <= keep:
            return ids
        return ids[-keep:] if self.side == "left" else ids[:keep]


def parse_truncation(body: dict) -> PromptTruncation | None:
    tokens = body.get("truncate_prompt_tokens")
    side = body.get("truncation_side")
    if side is not None and side not in SIDES:
        raise bad_request(f"'truncation_side' must be \"left\" (keep the last tokens) or \"right\" (keep the first), "
                          f"got {side!r:.60}", "truncation_side")
    if tokens is None:
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not (tokens == AS_MANY_AS_FIT or tokens >= 1):
        raise bad_request(f"'truncate_prompt_tokens' must be a positive number of tokens to keep, or -1 for as many "
                          f"as max_model_len allows, got {tokens!r:.60}", "truncate_prompt_tokens")
    return PromptTruncation(tokens, side or "left")
