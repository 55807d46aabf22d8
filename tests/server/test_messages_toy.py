"""Anthropic's Messages API on the real server process over the toy model, through the official ``anthropic``
client: plain and streamed messages agree, stop sequences and max_tokens give Anthropic's stop reasons, count_tokens
counts the prompt the message runs on, and every error is Anthropic's error body on these routes only.

The toy template writes ``<role>content`` per message and the toy tokenizer one token per character, so prompt
sizes can be counted by hand. This client no longer sends ``temperature``; it goes in ``extra_body``."""
import json

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
anthropic = pytest.importorskip("anthropic")

GREEDY = {"temperature": 0}
HELLO = [{"role": "user", "content": "hello"}]


def client(server, api_key="none"):
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=60)


def test_a_message_and_its_stream_agree(toy_server):
    c = client(toy_server)
    full = c.messages.create(model="toy", max_tokens=8, messages=HELLO, extra_body=GREEDY)
    assert full.type == "message" and full.role == "assistant" and full.model == "toy" and full.id.startswith("msg_")
    assert [b.type for b in full.content] == ["text"] and len(full.content[0].text) == 8
    assert full.stop_reason == "max_tokens" and full.stop_sequence is None
    assert full.usage.output_tokens == 8
    assert full.usage.input_tokens + full.usage.cache_read_input_tokens == len("<user>hello<assistant>")
    with c.messages.stream(model="toy", max_tokens=8, messages=HELLO, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == full.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == len("<user>hello<assistant>")
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]


def test_the_stream_names_every_event_as_anthropic_does(toy_server):
    body = {"model": "toy", "max_tokens": 3, "messages": HELLO, "stream": True}
    r = httpx.post(toy_server.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [frame.split("\n") for frame in r.text.strip().split("\n\n")]
    assert all(len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: ") for lines in events)
    for name, data in events:
        assert json.loads(data[6:])["type"] == name[7:]
    names = [name[7:] for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
    assert "[DONE]" not in r.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_ends_the_message_and_is_named(toy_server, stream):
    c = client(toy_server)
    text = c.messages.create(model="toy", max_tokens=12, messages=HELLO, extra_body=GREEDY).content[0].text
    sequence = text[5:7]
    kw = dict(model="toy", max_tokens=12, messages=HELLO, stop_sequences=["zzzz", sequence], extra_body=GREEDY)
    if stream:
        with c.messages.stream(**kw) as s:
            out = s.get_final_message()
    else:
        out = c.messages.create(**kw)
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == sequence
    assert out.content[0].text == text[:text.index(sequence)]


def test_count_tokens_counts_the_prompt_the_message_runs_on(toy_server):
    c = client(toy_server)
    parts = [{"type": "text", "text": "two "},
             {"type": "text", "text": "parts", "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": parts},
                {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"},
                {"role": "assistant", "content": "con"}]          # a final assistant turn is continued
    system = [{"type": "text", "text": "be brief"}]
    counted = c.messages.count_tokens(model="toy", system=system, messages=messages).input_tokens
    assert counted == len("<system>be brief<user>two parts<assistant>ok<user>more<assistant>con")
    for _ in range(2):              # the second run's prompt comes from the prefix cache
        usage = c.messages.create(model="toy", max_tokens=2, system=system, messages=messages).usage
        assert usage.input_tokens + usage.cache_read_input_tokens == counted
    assert usage.cache_read_input_tokens > 0 and usage.cache_creation_input_tokens == 0


def bad_request(c, match: str, **kw):
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(**{"model": "toy", "max_tokens": 3, "messages": HELLO, **kw})
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error", e.value.body
    assert match in e.value.body["error"]["message"], e.value.body
    return e.value.body["error"]["message"]


def test_bad_requests_are_anthropic_400s_naming_the_field(toy_server):
    c = client(toy_server)
    bad_request(c, "'max_tokens' is required", max_tokens=anthropic.omit)
    bad_request(c, "'messages[1].role'", messages=HELLO + [{"role": "system", "content": "x"}])
    bad_request(c, "'messages' is required", messages=[])
    bad_request(c, "unknown field 'frequency_penalty'", extra_body={"frequency_penalty": 1})
    bad_request(c, "'stop_sequences'", stop_sequences="x")
    bad_request(c, "'temperature'", extra_body={"temperature": 3})
    bad_request(c, "'max_tokens'", max_tokens=0)
    bad_request(c, "images are not supported", messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    bad_request(c, "'thinking'", thinking={"type": "adaptive"})        # no --reasoning-parser on the toy server
    bad_request(c, "'container'", container="c1")
    bad_request(c, "'service_tier'", extra_body={"service_tier": "priority"})
    bad_request(c, "server tool", tools=[{"type": "web_search_20250305", "name": "web_search"}])
    bad_request(c, "'tool_choice' needs 'tools'", tool_choice={"type": "any"})
    bad_request(c, "--enable-auto-tool-choice", tools=[{"name": "f", "input_schema": {"type": "object"}}])
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="claude-nope", max_tokens=3, messages=HELLO)
    assert e.value.body["error"]["type"] == "not_found_error"
    assert c.messages.create(model="toy", max_tokens=2, messages=HELLO, service_tier="standard_only",
                             metadata={"user_id": "u1"}, cache_control={"type": "ephemeral"}).usage.output_tokens == 2


def test_errors_keep_each_apis_shape(toy_server):
    for path in ("/v1/messages", "/messages", "/v1/messages/count_tokens"):
        r = httpx.post(toy_server.url + path, content=b"{not json")
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        r = httpx.get(toy_server.url + path)
        assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error", r.text
    r = httpx.post(toy_server.url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "type" not in r.json() and r.json()["error"]["code"] == 400


def test_the_api_key_is_read_from_x_api_key_and_a_wrong_one_is_refused(start_toy_server):
    server = start_toy_server("--api-key", "sekrit")
    with pytest.raises(anthropic.AuthenticationError) as e:
        client(server, "wrong").messages.create(model="toy", max_tokens=2, messages=HELLO)
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                         "message": e.value.body["error"]["message"]}}
    ok = client(server, "sekrit").messages.create(model="toy", max_tokens=2, messages=HELLO,
                                                  extra_headers={"anthropic-version": "2023-06-01"})
    assert ok.usage.output_tokens == 2
    bearer = httpx.post(server.url + "/v1/messages/count_tokens", headers={"authorization": "Bearer sekrit"},
                        json={"model": "toy", "messages": HELLO})
    assert bearer.json() == {"input_tokens": len("<user>hello<assistant>")}
    openai_shape = httpx.post(server.url + "/v1/chat/completions", json={"messages": HELLO})
    assert openai_shape.status_code == 401 and openai_shape.json()["error"]["type"] == "authentication_error"


def test_a_full_server_answers_overloaded_error_with_retry_after(start_toy_server):
    server = start_toy_server("--max-num-seqs", "1", "--max-queued-requests", "0")
    body = {"model": "toy", "max_tokens": 200, "messages": HELLO, "stream": True, **GREEDY}      # greedy: no EOS
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as held:
        assert held.status_code == 200
        lines = held.iter_lines()                   # kept: a dropped iterator closes the connection
        assert next(lines) == "event: message_start"     # admitted: it holds the one sequence
        with pytest.raises(anthropic.APIStatusError) as e:
            client(server).messages.create(model="toy", max_tokens=2, messages=HELLO)
    assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
    assert e.value.body["error"]["type"] == "overloaded_error" and "--max-num-seqs" in e.value.body["error"]["message"]
