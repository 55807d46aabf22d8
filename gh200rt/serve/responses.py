"""OpenAI response and stream-chunk bodies for completions and chat completions."""
from __future__ import annotations

import math
import time

from gh200rt.serve.generation import ChoiceDelta


def _token_text(tokenizer, token_id: int, lp) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def completion_logprobs(tokenizer, deltas: list[ChoiceDelta], offset: int) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for d in deltas:
        for token_id, entry in zip(d.token_ids, d.logprobs or []):
            chosen = entry.get(token_id)
            text = _token_text(tokenizer, token_id, chosen)
            out["tokens"].append(text)
            out["token_logprobs"].append(_finite(chosen.logprob) if chosen else None)
            out["top_logprobs"].append({_token_text(tokenizer, t, lp): _finite(lp.logprob)
                                        for t, lp in sorted(entry.items(), key=lambda kv: kv[1].rank)})
            out["text_offset"].append(offset)
            offset += len(text)
    return out


def chat_logprobs(tokenizer, deltas: list[ChoiceDelta], top: int) -> dict:
    content = []
    for d in deltas:
        for token_id, entry in zip(d.token_ids, d.logprobs or []):
            chosen = entry.get(token_id)
            text = _token_text(tokenizer, token_id, chosen)
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:top]
            content.append({"token": text, "logprob": _finite(chosen.logprob) if chosen else -9999.0,
                            "bytes": list(text.encode()),
                            "top_logprobs": [{"token": _token_text(tokenizer, t, lp), "logprob": _finite(lp.logprob),
                                              "bytes": list(_token_text(tokenizer, t, lp).encode())}
                                             for t, lp in ranked]})
    return {"content": content}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def envelope(request_id: str, obj: str, model: str, choices: list, created: int | None = None) -> dict:
    return {"id": request_id, "object": obj, "created": created or int(time.time()), "model": model,
            "choices": choices}
