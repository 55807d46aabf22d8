"""OpenAI response and stream-chunk bodies for completions and chat completions.

Completions with ``echo`` and ``logprobs`` score the prompt too, as vLLM does: the logprobs
cover the prompt tokens first (the first has no context, so its logprob is null), then the
generated ones, with ``text_offset`` counted from the start of the echoed text.
"""
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


def generated_pairs(deltas: list[ChoiceDelta]) -> list[tuple[int, dict | None]]:
    """(token id, {token id: Logprob}) for every generated token of these deltas."""
    return [pair for d in deltas for pair in zip(d.token_ids, d.logprobs or [])]


def prompt_pairs(run, prompt_index: int) -> list[tuple[int, dict | None]]:
    ids = run.prompt_token_ids.get(prompt_index) or []
    lps = run.prompt_logprobs.get(prompt_index) or []
    return list(zip(ids, list(lps) + [None] * (len(ids) - len(lps))))


def completion_logprobs(tokenizer, pairs: list[tuple[int, dict | None]], offset: int) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, entry in pairs:
        chosen = entry.get(token_id) if entry else None
        text = _token_text(tokenizer, token_id, chosen)
        out["tokens"].append(text)
        out["token_logprobs"].append(_finite(chosen.logprob) if chosen else None)
        out["top_logprobs"].append({_token_text(tokenizer, t, lp): _finite(lp.logprob)
                                    for t, lp in sorted(entry.items(), key=lambda kv: kv[1].rank)}
                                   if entry else None)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def chat_logprobs(tokenizer, deltas: list[ChoiceDelta], top: int) -> dict:
    content = []
    for token_id, entry in generated_pairs(deltas):
        chosen = entry.get(token_id)
        text = _token_text(tokenizer, token_id, chosen)
        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:top]
        content.append({"token": text, "logprob": _finite(chosen.logprob) if chosen else -9999.0,
                        "bytes": list(text.encode()),
                        "top_logprobs": [{"token": _token_text(tokenizer, t, lp), "logprob": _finite(lp.logprob),
                                          "bytes": list(_token_text(tokenizer, t, lp).encode())}
                                         for t, lp in ranked]})
    return {"content": content}


def echo_text(tokenizer, run, prompt_index: int) -> str:
    text, ids = run.parsed.prompts[prompt_index]
    return text if text is not None else tokenizer.decode(ids, skip_special_tokens=False)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def envelope(request_id: str, obj: str, model: str, choices: list, created: int | None = None) -> dict:
    return {"id": request_id, "object": obj, "created": created or int(time.time()), "model": model,
            "choices": choices}


def completion_body(tok, run, model: str, chat: bool, request_id: str, per_choice: dict) -> dict:
    """The non-streamed body: one choice per (prompt, n) in order, usage over all of them."""
    parsed = run.parsed
    n = parsed.params.n
    choices = []
    for index in range(len(parsed.prompts) * n):
        deltas = per_choice.get(index, [])
        text = "".join(d.text for d in deltas)
        last = next((d for d in reversed(deltas) if d.finish_reason), None)
        finish, stop_reason = (last.finish_reason, last.stop_reason) if last else (None, None)
        if chat:
            lp = chat_logprobs(tok, deltas, parsed.logprobs) if parsed.logprobs is not None else None
            choices.append({"index": index, "message": {"role": "assistant", "content": text},
                            "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason})
            continue
        prefix = echo_text(tok, run, index // n) if parsed.echo else ""
        lp = None
        if parsed.logprobs is not None:
            pairs = (prompt_pairs(run, index // n) if parsed.echo else []) + generated_pairs(deltas)
            lp = completion_logprobs(tok, pairs, 0)
        choices.append({"index": index, "text": prefix + text, "logprobs": lp, "finish_reason": finish,
                        "stop_reason": stop_reason})
    body = envelope(request_id, "chat.completion" if chat else "text_completion", model, choices)
    body["usage"] = usage(run.prompt_tokens, run.completion_tokens)
    return body
