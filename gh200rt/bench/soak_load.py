"""The soak's mixed load (``stress``): one client loop that sends, in an order drawn from its seed,
each kind of request users send, and tallies how each ended.

Kinds: a plain completion or chat; a streamed one (usage last, one finish_reason, ``[DONE]``); an
abort (a stream the client cancels after a few chunks); a disconnect (a plain request whose client
gives up before the answer); a structured output (``response_format`` json_schema: a finished answer
must parse and match); a seeded request sent twice (the same seed must give the same text, whatever
else the batch held each time); n=2 (two choices). A 503 is a refusal, any other failure (status,
body, broken stream, transport error) a failure; both are counted and never stop the loop.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

import httpx

from gh200rt.bench.server import SCHEMA

PROMPTS = ["The quick brown fox", "Write a short poem about the sea.", "List three prime numbers:",
           "Explain what a KV cache is.", "Once upon a time", "The capital of France is", "def fibonacci(n):",
           "Summarize the plot of Hamlet.", "Give me a recipe for pancakes.", "Why is the sky blue?"]
WEIGHTS = {"plain": 3, "streamed": 3, "abort": 1, "disconnect": 1, "structured": 1, "seeded": 1, "n2": 1}


class Refused(Exception):
    """503: the server is full."""


class Failed(Exception):
    """Anything a correct server would not have answered."""
    reason = "failed"


class SeedMismatch(Failed):
    reason = "seeded repeat differed"


class OffSchema(Failed):
    reason = "structured answer off-schema"


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    left: int = 0              # the client left on purpose (abort, disconnect)
    unfinished: int = 0        # structured answers cut by max_tokens: not checkable, not wrong
    refused: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # failures by reason
    errors: list[str] = field(default_factory=list)        # the first few, verbatim


def _prompt(rng: random.Random) -> str:
    return f"{rng.choice(PROMPTS)} ({rng.randrange(10**6)})"    # a fresh suffix: prefix-cache hits, not whole prompts


def _request(rng: random.Random, **body) -> tuple[str, dict]:
    if rng.random() < 0.5:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": _prompt(rng)}], **body}
    return "/v1/completions", {"prompt": _prompt(rng), **body}


def _text(choice: dict) -> str:
    return choice["message"]["content"] if "message" in choice else choice["text"]


async def _post(client: httpx.AsyncClient, path: str, body: dict, timeout: float | None = None) -> dict:
    r = await client.post(path, json=body, **({"timeout": timeout} if timeout else {}))
    if r.status_code == 503:
        raise Refused(r.text[:200])
    if r.status_code != 200:
        raise Failed(f"HTTP {r.status_code}: {r.text[:300]}")
    answer = r.json()
    if not answer.get("choices") or any(c["finish_reason"] not in ("stop", "length") for c in answer["choices"]):
        raise Failed(f"unfinished answer: {str(answer)[:300]}")
    return answer


async def _stream(client: httpx.AsyncClient, path: str, body: dict, leave_after: int | None = None) -> list[dict]:
    """Every chunk up to [DONE]; with ``leave_after``, the first chunks only (the connection is then closed)."""
    chunks, done = [], False
    async with client.stream("POST", path, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")[:300]
            raise (Refused if r.status_code == 503 else Failed)(f"HTTP {r.status_code}: {text}")
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise Failed(f"error in the stream: {chunk['error']}")
                chunks.append(chunk)
                if leave_after is not None and len(chunks) >= leave_after:
                    return chunks
    if leave_after is None and not done:
        raise Failed(f"the stream ended without [DONE] after {len(chunks)} chunks")
    return chunks


async def plain(client, rng) -> str:
    path, body = _request(rng, max_tokens=rng.randint(8, 48), temperature=0.8, top_p=0.95)
    await _post(client, path, body)
    return "ok"


async def streamed(client, rng) -> str:
    path, body = _request(rng, max_tokens=rng.randint(8, 48), temperature=0.8,
                          stream_options={"include_usage": True})
    chunks = await _stream(client, path, body)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    if len(finishes) != 1 or not chunks[-1].get("usage"):
        raise Failed(f"finish reasons {finishes}, last chunk {str(chunks[-1])[:200]}")
    return "ok"


async def abort(client, rng) -> str:
    path, body = _request(rng, max_tokens=200, ignore_eos=True)
    await _stream(client, path, body, leave_after=rng.randint(1, 5))
    return "left"


async def disconnect(client, rng) -> str:
    path, body = _request(rng, max_tokens=200, ignore_eos=True)
    try:
        await _post(client, path, body, timeout=rng.uniform(0.05, 1.5))
    except httpx.TimeoutException:
        return "left"
    return "ok"                              # answered before the client gave up


async def structured(client, rng) -> str:
    path, body = _request(rng, max_tokens=48, temperature=0.7, response_format={
        "type": "json_schema", "json_schema": {"name": "soak", "schema": SCHEMA}})
    choice = (await _post(client, path, body))["choices"][0]
    if choice["finish_reason"] != "stop":
        return "unfinished"
    try:
        value = json.loads(_text(choice))
    except json.JSONDecodeError:
        raise OffSchema(f"structured answer is not JSON: {_text(choice)!r}") from None
    if not (isinstance(value, dict) and set(value) == {"ok", "n"} and isinstance(value["ok"], bool)
            and isinstance(value["n"], int) and 0 <= value["n"] <= 9):
        raise OffSchema(f"structured answer does not match the schema: {_text(choice)!r}")
    return "ok"


async def seeded(client, rng) -> str:
    path, body = _request(rng, max_tokens=16, temperature=1.0, seed=rng.randrange(2**31))
    first = _text((await _post(client, path, body))["choices"][0])
    again = _text((await _post(client, path, body))["choices"][0])
    if first != again:
        raise SeedMismatch(f"seed {body['seed']} gave {first!r}, then {again!r}")
    return "ok"


async def n2(client, rng) -> str:
    answer = await _post(client, "/v1/completions", {"prompt": _prompt(rng), "n": 2, "max_tokens": 16,
                                                     "temperature": 1.0})
    if sorted(c["index"] for c in answer["choices"]) != [0, 1]:
        raise Failed(f"n=2 gave choices {[c['index'] for c in answer['choices']]}")
    return "ok"


KINDS = {"plain": plain, "streamed": streamed, "abort": abort, "disconnect": disconnect, "structured": structured,
         "seeded": seeded, "n2": n2}


async def send_one(client: httpx.AsyncClient, rng: random.Random, name: str, tally: Tally) -> None:
    tally.sent += 1
    try:
        outcome = await KINDS[name](client, rng)
    except Refused:
        tally.refused += 1
        return
    except (Failed, httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        tally.failed += 1
        reason = getattr(e, "reason", type(e).__name__)
        tally.reasons[reason] = tally.reasons.get(reason, 0) + 1
        if len(tally.errors) < 5:
            tally.errors.append(f"{type(e).__name__}: {e}"[:400])
        return
    setattr(tally, outcome, getattr(tally, outcome) + 1)


async def client_loop(client: httpx.AsyncClient, seed: int, deadline: float, tallies: dict[str, Tally]) -> None:
    rng = random.Random(seed)
    names, weights = list(WEIGHTS), list(WEIGHTS.values())
    while time.monotonic() < deadline:
        name = rng.choices(names, weights)[0]
        await send_one(client, rng, name, tallies[name])
