"""Structured outputs against ``python -m gh200rt.serve`` over a tiny random Llama with a byte-level
tokenizer (tests/server/byte_llama.py): its unconstrained text is noise, so every valid answer below
is the grammar's doing. Seeded, temperature 1, streaming and not, every request field that asks for a
constraint (response_format, structured_outputs, guided_*)."""
import asyncio
import json
import re

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
jsonschema = pytest.importorskip("jsonschema")

from tests.server.byte_llama import serve_byte_llama  # noqa: E402

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "address"], "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"], "properties": {
        "city": {"type": "string", "maxLength": 6}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}
TAGS = {"type": "object", "additionalProperties": False, "required": ["tags", "scores"], "properties": {
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4},
    "scores": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": -5, "maximum": 99}}}}
FLAGS = {"type": "object", "additionalProperties": False, "required": ["color", "ok", "note"], "properties": {
    "color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
    "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]}}}
ITEMS = {"type": "array", "minItems": 1, "maxItems": 3, "items": {
    "type": "object", "additionalProperties": False, "required": ["id", "kind"], "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9}, "kind": {"enum": ["x", "y"]}}}}
SCHEMAS = [PERSON, TAGS, FLAGS, ITEMS]
REGEX = r"[0-9]{3}-[a-z]{2,4}( ok)?"
CHOICES = ["yes", "no", "maybe so", "n/a"]
MESSAGES = [{"role": "user", "content": "answer"}]


@pytest.fixture(scope="module")
def byte_server(tmp_path_factory):
    server = serve_byte_llama(tmp_path_factory, "--max-model-len", "512", "--max-num-seqs", "32")
    yield server
    server.stop()


def json_request(i: int, schema: dict) -> tuple[str, dict]:
    """Every way a client asks for a schema, in turn: chat response_format, vLLM structured_outputs,
    the older guided_json; on chat and on completions."""
    way = i % 3
    common = {"max_tokens": 300, "temperature": 1.0, "seed": 1000 + i}
    if way == 0:
        return "/v1/chat/completions", {**common, "messages": MESSAGES, "response_format": {
            "type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}}
    if way == 1:
        return "/v1/completions", {**common, "prompt": "answer:", "structured_outputs": {"json": schema}}
    return "/v1/chat/completions", {**common, "messages": MESSAGES, "guided_json": json.dumps(schema)}


def text_of(path: str, body: dict, response: httpx.Response) -> tuple[str, str]:
    """(text, finish_reason) of a streamed or plain response."""
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        choice = response.json()["choices"][0]
        return choice["message"]["content"] if "message" in choice else choice["text"], choice["finish_reason"]
    text, finish = "", None
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"][0]
            text += choice["delta"].get("content") or "" if "delta" in choice else choice["text"]
            finish = choice["finish_reason"] or finish
    return text, finish


async def run_all(server, requests: list[tuple[str, dict]]) -> list[tuple[str, str]]:
    async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=httpx.Limits(max_connections=64)) as c:
        async def one(path, body):
            return text_of(path, body, await c.post(path, json=body))
        return await asyncio.gather(*(one(p, b) for p, b in requests))


def test_50_sampled_requests_return_json_valid_for_their_schema(byte_server):
    requests, schemas = [], []
    for i in range(50):
        schema = SCHEMAS[i % len(SCHEMAS)]
        path, body = json_request(i, schema)
        requests.append((path, {**body, "stream": i % 2 == 1}))
        schemas.append(schema)
    for (text, finish), schema, (_, body) in zip(asyncio.run(run_all(byte_server, requests)), schemas, requests):
        assert finish == "stop", (finish, text, body)
        jsonschema.validate(json.loads(text), schema)


def test_unconstrained_output_of_this_model_is_not_json(byte_server):
    """The control: without a constraint the same model and seeds do not write valid JSON."""
    requests = [("/v1/completions", {"prompt": "answer:", "max_tokens": 40, "temperature": 1.0, "seed": 1000 + i})
                for i in range(5)]
    for text, _ in asyncio.run(run_all(byte_server, requests)):
        with pytest.raises(ValueError):
            json.loads(text)


def test_regex_and_choice_always_match(byte_server):
    requests = []
    for i in range(24):
        stream = i % 2 == 0
        common = {"max_tokens": 40, "temperature": 1.0, "seed": i, "stream": stream}
        regex = {"guided_regex": REGEX} if i % 4 < 2 else {"structured_outputs": {"regex": REGEX}}
        choice = {"guided_choice": CHOICES} if i % 4 < 2 else {"structured_outputs": {"choice": CHOICES}}
        requests.append(("/v1/completions", {**common, "prompt": "r", **regex}))
        requests.append(("/v1/chat/completions", {**common, "messages": MESSAGES, **choice}))
    results = asyncio.run(run_all(byte_server, requests))
    for (path, body), (text, finish) in zip(requests, results):
        assert finish == "stop", (text, body)
        if "guided_regex" in body or "regex" in body.get("structured_outputs", {}):
            assert re.fullmatch(REGEX, text), text
        else:
            assert text in CHOICES, text
    assert len({text for (_, b), (text, _) in zip(requests, results) if b["prompt" if "prompt" in b else
                                                                          "messages"] == MESSAGES}) > 1


def test_json_object_mode_and_n_greater_than_one(byte_server):
    body = {"messages": MESSAGES, "max_tokens": 400, "temperature": 1.0, "seed": 5, "n": 4,
            "response_format": {"type": "json_object"}, "logit_bias": {"262": -100}}     # no '{"' merge token
    r = httpx.post(byte_server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["message"]["content"]), dict)
    assert any(c["finish_reason"] == "stop" for c in r.json()["choices"])


@pytest.mark.parametrize("field,value", [
    ("guided_regex", "[0-9"), ("guided_json", "{not json"), ("guided_json", {"type": "integer", "minimum": "x"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
    ("response_format", {"type": "json_schema"}), ("response_format", {"type": "xml"}),
    ("structured_outputs", {"regex": "(", "choice": ["a"]}), ("structured_outputs", {"grammar": "start: @@"}),
    ("guided_choice", []), ("guided_choice", ["a", 1])])
def test_invalid_constraints_are_a_400_naming_the_field(byte_server, field, value):
    for path, base in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "x"})):
        r = httpx.post(byte_server.url + path, json={**base, "max_tokens": 4, field: value}, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field, r.json()
    ok = httpx.post(byte_server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200


def test_grammar_and_two_constraints_at_once(byte_server):
    grammar = 'start: "<" ("a" | "b")+ ">"'
    r = httpx.post(byte_server.url + "/v1/completions", json={
        "prompt": "g", "max_tokens": 30, "temperature": 1.0, "seed": 3, "structured_outputs": {"grammar": grammar}})
    assert r.status_code == 200 and re.fullmatch(r"<[ab]+>", r.json()["choices"][0]["text"]), r.text
    gbnf = 'root ::= "x" [0-9] [0-9]'
    r = httpx.post(byte_server.url + "/v1/completions", json={
        "prompt": "g", "max_tokens": 30, "temperature": 1.0, "seed": 3, "guided_grammar": gbnf})
    assert r.status_code == 200 and re.fullmatch(r"x[0-9]{2}", r.json()["choices"][0]["text"]), r.text
    r = httpx.post(byte_server.url + "/v1/completions", json={
        "prompt": "g", "max_tokens": 3, "guided_regex": "a", "guided_choice": ["b"]})
    assert r.status_code == 400


def test_llama_cpp_grammar_json_schema_and_json_object_schema(byte_server):
    """llama.cpp's names for a constraint: top-level GBNF 'grammar' and 'json_schema', and a json_object
    response_format that carries its schema."""
    common = {"max_tokens": 300, "temperature": 1.0}
    for i in range(4):
        r = httpx.post(byte_server.url + "/completions", json={**common, "prompt": "g", "seed": 30 + i,
                                                               "grammar": 'root ::= "x" [0-9] [0-9]'}, timeout=60)
        assert r.status_code == 200 and re.fullmatch(r"x[0-9]{2}", r.json()["choices"][0]["text"]), r.text
        schema = SCHEMAS[i]
        for path, body in (("/completions", {"prompt": "answer:", "json_schema": schema}),
                           ("/chat/completions", {"messages": MESSAGES, "response_format": {
                               "type": "json_object", "schema": schema}})):
            text, finish = text_of(path, body, httpx.post(byte_server.url + path, json={
                **common, "seed": 40 + i, **body}, timeout=120))
            assert finish == "stop", text
            jsonschema.validate(json.loads(text), schema)
    for conflict in ({"grammar": 'root ::= "a"', "json_schema": PERSON},
                     {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}},
                     {"json_schema": PERSON, "guided_regex": "a"}):
        r = httpx.post(byte_server.url + "/completions", json={"prompt": "x", "max_tokens": 2, **conflict}, timeout=30)
        assert r.status_code == 400 and "one output constraint" in r.json()["error"]["message"], r.text
    for field, value in (("grammar", "root ::= @@"), ("json_schema", {"type": "nope"}), ("grammar", 7)):
        r = httpx.post(byte_server.url + "/completions", json={"prompt": "x", "max_tokens": 2, field: value}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = httpx.post(byte_server.url + "/completions", json={"prompt": "x", "max_tokens": 2, "response_format": {
        "type": "json_object", "schema": {"type": "nope"}}}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
