"""OpenAI response and stream-chunk bodies for completions and chat completions.

Completions with ``echo`` and ``logprobs`` score the prompt too, as vLLM does: the logprobs
cover the prompt tokens first (the first has no context, so its logprob is null), then the
generated ones, with ``text_offset`` counted from the start of the echoed text.
"""
from __future__ import annotations

import math
import time

import gh200rt
from gh200rt.serve.generation import ChoiceDelta
from gh200rt.serve.reasoning import reasoning_fields
from gh200rt.serve.tools import split_tool_calls, tool_call_dicts

SYSTEM_FINGERPRINT = f"gh200rt-{gh200rt.__version__}"


class TokenNames:
    """How logprobs name a token: its decoded text, or ``token_id:N`` with vLLM's return_tokens_as_token_ids
    (for tokens whose text is not valid JSON on its own, such as a part of a multi-byte character)."""

    def __init__(self, tokenizer, as_ids: bool = False):
        self.tokenizer = tokenizer
        self.as_ids = as_ids

    def __call__(self, token_id: int, lp) -> str:
        if self.as_ids:
            return f"token_id:{token_id}"
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def generated_pairs(deltas: list[ChoiceDelta]) -> list[tuple[int, dict | None]]:
    """(token id, {token id: Logprob}) for every generated token of these deltas."""
    return [pair for d in deltas for pair in zip(d.token_ids, d.logprobs or [])]


def prompt_pairs(run, prompt_index: int) -> list[tuple[int, dict | None]]:
    ids = run.prompt_token_ids.get(prompt_index) or []
    lps = run.prompt_logprobs.get(prompt_index) or []
    return list(zip(ids, list(lps) + [None] * (len(ids) - len(lps))))


def completion_logprobs(names: TokenNames, pairs: list[tuple[int, dict | None]], offset: int) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, entry in pairs:
        chosen = entry.get(token_id) if entry else None
        text = names(token_id, chosen)
        out["tokens"].append(text)
        out["token_logprobs"].append(_finite(chosen.logprob) if chosen else None)
        out["top_logprobs"].append({names(t, lp): _finite(lp.logprob)
                                    for t, lp in sorted(entry.items(), key=lambda kv: kv[1].rank)}
                                   if entry else None)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def chat_logprobs(names: TokenNames, deltas: list[ChoiceDelta], top: int, pinned: list[int] | None = None,
                  with_ids: bool = False) -> dict:
    """``top_logprobs`` holds the ``top`` most likely tokens, or the sampled token and the ``pinned`` ones
    (logprob_token_ids: vLLM's sampler gives the sampled token the first slot); ``with_ids``: each entry leads with its
    token's ``id``, as llama.cpp's answers to ``n_probs`` do."""
    def entry_of(token_id: int, text: str, logprob: float) -> dict:
        entry = {"token": text, "logprob": logprob, "bytes": list(text.encode())}
        return {"id": token_id, **entry} if with_ids else entry

    content = []
    for token_id, entry in generated_pairs(deltas):
        chosen = entry.get(token_id)
        if pinned:
            ranked = [(token_id, chosen)] * (chosen is not None and token_id not in pinned) + \
                sorted([(t, lp) for t, lp in entry.items() if t in pinned], key=lambda kv: kv[1].rank)
        else:
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:top]
        content.append({**entry_of(token_id, names(token_id, chosen), _finite(chosen.logprob) if chosen else -9999.0),
                        "top_logprobs": [entry_of(t, names(t, lp), _finite(lp.logprob)) for t, lp in ranked]})
    return {"content": content}


def echo_text(tokenizer, run, prompt_index: int) -> str:
    text, ids = run.parsed.prompts[prompt_index]
    return text if text is not None else tokenizer.decode(ids, skip_special_tokens=False)


def usage(run) -> dict:
    """Over all prompts and choices so far; cached_tokens: prompt tokens the prefix cache supplied."""
    prompt, completion = run.prompt_tokens, run.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": run.num_cached_tokens}}


def envelope(request_id: str, obj: str, model: str, choices: list, created: int | None = None) -> dict:
    return {"id": request_id, "object": obj, "created": created or int(time.time()), "model": model,
            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices}


def prompt_logprobs_body(tokenizer, entries) -> list | None:
    """vLLM's ``prompt_logprobs``: per prompt token None (the first) or {token id: {logprob, rank, decoded_token}}."""
    if entries is None:
        return None
    names = TokenNames(tokenizer)
    return [None if e is None else {str(t): {"logprob": _finite(lp.logprob), "rank": lp.rank,
                                             "decoded_token": names(t, lp)} for t, lp in e.items()}
            for e in entries]


def logprob_names(tokenizer, parsed) -> TokenNames:
    return TokenNames(tokenizer, parsed.return_tokens_as_token_ids)


def chat_choice_logprobs(tokenizer, parsed, deltas: list[ChoiceDelta]) -> dict | None:
    if parsed.logprobs is None:
        return None
    return chat_logprobs(logprob_names(tokenizer, parsed), deltas, parsed.logprobs, parsed.params.logprob_token_ids,
                         parsed.logprob_ids)


def chat_message(run, text: str, finish: str | None) -> tuple[dict, str | None]:
    """The assistant message of a finished choice (its reasoning split off, then tool calls read out of the
    answer's content: never out of the reasoning) and its finish_reason."""
    parsed = run.parsed
    tools = parsed.extra.get("tools")
    reasoning, content = None, text
    if parsed.extra.get("reasoning") is not None:
        reasoning, content = parsed.extra["reasoning"].split(text)
    message = {"role": "assistant", "content": content}
    if tools is not None and tools.parses_output and finish == "stop" and content is not None:
        content, calls = split_tool_calls(tools, content)
        if calls:
            message = {"role": "assistant", "content": content, "tool_calls": tool_call_dicts(calls)}
            finish = "tool_calls"
    if reasoning is not None and parsed.extra.get("include_reasoning", True):
        message.update(reasoning_fields(reasoning))
    if parsed.echo and message["content"] is not None:
        message["content"] = parsed.extra["echo_text"] + message["content"]
    return message, finish


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
        token_ids = [t for d in deltas for t in d.token_ids] if parsed.return_token_ids else None
        if chat:
            message, finish = chat_message(run, text, finish)
            # vLLM's chat choice always carries token_ids (null unless asked for); clients read it unguarded
            choices.append({"index": index, "message": message, "logprobs": chat_choice_logprobs(tok, parsed, deltas),
                            "finish_reason": finish, "stop_reason": stop_reason, "token_ids": token_ids})
            continue
        prefix = echo_text(tok, run, index // n) if parsed.echo else ""
        lp = None
        if parsed.logprobs is not None:
            pairs = (prompt_pairs(run, index // n) if parsed.echo else []) + generated_pairs(deltas)
            lp = completion_logprobs(logprob_names(tok, parsed), pairs, 0)
        # vLLM's choice always carries these three keys, null unless asked for; clients read them unguarded
        choices.append({"index": index, "text": prefix + text, "logprobs": lp, "finish_reason": finish,
                        "stop_reason": stop_reason, "token_ids": token_ids,
                        "prompt_token_ids": run.prompt_token_ids.get(index // n) if parsed.return_token_ids else None,
                        "prompt_logprobs": prompt_logprobs_body(tok, run.prompt_logprobs.get(index // n))
                        if parsed.prompt_logprobs is not None else None})
    body = envelope(request_id, "chat.completion" if chat else "text_completion", model, choices)
    if chat:        # vLLM's chat body always carries both keys, null unless asked for
        body["prompt_token_ids"] = run.prompt_token_ids.get(0) if parsed.return_token_ids else None
        body["prompt_logprobs"] = prompt_logprobs_body(tok, run.prompt_logprobs.get(0)) \
            if parsed.prompt_logprobs is not None else None
    body["usage"] = usage(run)
    return body
