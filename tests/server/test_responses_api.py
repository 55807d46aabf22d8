"""OpenAI's Responses API (/v1/responses) through the official ``openai`` client against ``python -m gh200rt.serve``
over the tiny byte-level Llama (random weights, greedy or seeded): ``responses.create`` and ``responses.stream`` give
the same answer, ``previous_response_id`` continues a stored conversation, function tools make calls whose outputs
go back as items, ``text.format`` constrains the answer, ``max_output_tokens`` makes it incomplete; stored responses
are read, listed and deleted; a response being generated is cancelled from another request; unknown or unhonoured
fields are a 400 naming them."""
import json
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from tests.server.byte_llama import serve_byte_llama  # noqa: E402
from tests.server.test_tool_calling import ADD, WEATHER, client  # noqa: E402

TOOLS = [{"type": "function", "name": "get_weather", "description": "weather", "parameters": WEATHER},
         {"type": "function", "name": "add", "parameters": ADD}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve_byte_llama(tmp_path_factory, "--max-model-len", "1024", "--enable-auto-tool-choice",
                         "--tool-call-parser", "hermes", "--max-stored-responses", "3")
    yield s
    s.stop()


def test_create_and_stream_give_the_same_answer(server):
    c = client(server)
    kw = dict(model="byte", input="Say hello.", instructions="Be brief.", max_output_tokens=12, temperature=0,
              metadata={"case": "greedy"})
    plain = c.responses.create(**kw)
    assert plain.object == "response" and plain.id.startswith("resp_") and plain.status in ("completed", "incomplete")
    assert [item.type for item in plain.output] == ["message"]
    assert plain.output_text and plain.output[0].content[0].type == "output_text"
    assert plain.usage.output_tokens == 12 and plain.usage.input_tokens > 0
    assert plain.usage.total_tokens == plain.usage.input_tokens + plain.usage.output_tokens
    assert (plain.instructions, plain.max_output_tokens, plain.metadata) == ("Be brief.", 12, {"case": "greedy"})
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    with c.responses.stream(**kw) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    final = events[-1].response          # cut by max_output_tokens: response.incomplete (no response.completed)
    assert final.output_text == plain.output_text and final.id != plain.id and final.status == "incomplete"
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.delta",
            "response.output_text.done", "response.content_part.done", "response.output_item.done"} <= set(kinds)
    events = httpx.post(server.url + "/v1/responses", json={**kw, "stream": True}, timeout=60).text
    numbers = [json.loads(line[6:])["sequence_number"] for line in events.splitlines() if line.startswith("data: ")]
    assert numbers == list(range(len(numbers))) and "event: response.output_text.delta" in events


def test_a_stored_response_is_read_continued_listed_and_deleted(server):
    c = client(server)
    first = c.responses.create(model="byte", input=[{"role": "user", "content": "My name is Ada."}],
                               max_output_tokens=4, temperature=0)
    assert c.responses.retrieve(first.id).output_text == first.output_text
    items = c.responses.input_items.list(first.id)
    assert [item.type for item in items.data] == ["message"] and items.data[0].id
    second = c.responses.create(model="byte", input="And my name?", previous_response_id=first.id,
                                max_output_tokens=4, temperature=0)
    assert second.previous_response_id == first.id
    # the continuation's prompt holds the first turn and its answer: more input than the question alone
    alone = c.responses.create(model="byte", input="And my name?", max_output_tokens=4, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        c.responses.retrieve(first.id)
    unstored = c.responses.create(model="byte", input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError, match="previous_response_id|no stored response"):
        c.responses.create(model="byte", input="hi", previous_response_id=unstored.id, max_output_tokens=2)


def test_the_store_forgets_the_least_recently_used_past_its_bound(server):
    c = client(server)
    ids = [c.responses.create(model="byte", input=f"n{i}", max_output_tokens=1).id for i in range(3)]
    c.responses.retrieve(ids[0])                              # used: the oldest is now ids[1]
    c.responses.create(model="byte", input="n3", max_output_tokens=1)
    c.responses.retrieve(ids[0])
    with pytest.raises(openai.NotFoundError, match="--max-stored-responses"):
        c.responses.retrieve(ids[1])


@pytest.mark.parametrize("stream", [False, True])
def test_function_calls_and_their_outputs_round_trip(server, stream):
    c = client(server)
    kw = dict(model="byte", input="weather in Paris?", tools=TOOLS, tool_choice="required", temperature=1.0,
              max_output_tokens=400, parallel_tool_calls=False)
    if stream:
        with c.responses.stream(**kw) as s:
            kinds = [event.type for event in s]
            response = s.get_final_response()
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    else:
        response = c.responses.create(**kw)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and response.status == "completed"
    call = calls[0]
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    from tests.server.test_tool_calling import SCHEMAS
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    follow = c.responses.create(model="byte", previous_response_id=response.id, tools=TOOLS, tool_choice="none",
                                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}],
                                max_output_tokens=3)
    assert [item.type for item in follow.output] == ["message"]
    # the same conversation sent whole, without the store: the same prompt length
    whole = c.responses.create(model="byte", tools=TOOLS, tool_choice="none", max_output_tokens=3, input=[
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}])
    assert whole.usage.input_tokens == follow.usage.input_tokens


def test_text_format_json_schema_constrains_the_answer(server):
    schema = {"type": "object", "additionalProperties": False, "required": ["n"],
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}
    out = client(server).responses.create(model="byte", input="a number", max_output_tokens=40, temperature=1.0,
                                          text={"format": {"type": "json_schema", "name": "n", "schema": schema,
                                                           "strict": True}})
    jsonschema.validate(json.loads(out.output_text), schema)
    assert out.text.format.type == "json_schema"


def test_logprobs_come_with_the_output_text_when_included(server):
    out = client(server).responses.create(model="byte", input="hi", max_output_tokens=5, temperature=0,
                                          include=["message.output_text.logprobs"], top_logprobs=2)
    logprobs = out.output[0].content[0].logprobs
    assert len(logprobs) == 5 and all(len(lp.top_logprobs) == 2 for lp in logprobs)


def test_a_response_being_generated_is_cancelled_from_another_request(server):
    c = client(server)
    seen: dict = {}

    def stream():
        with c.responses.stream(model="byte", input="go on", max_output_tokens=900, temperature=1.0) as s:
            for event in s:
                if event.type == "response.created":
                    seen["id"] = event.response.id
                seen["last"] = event
    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 60
    while "id" not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert c.responses.retrieve(seen["id"]).status == "in_progress"
    cancelled = c.responses.cancel(seen["id"])
    thread.join(60)
    assert cancelled.status == "cancelled" and cancelled.usage.output_tokens < 900
    assert seen["last"].type == "response.incomplete" and seen["last"].response.status == "cancelled"
    with pytest.raises(openai.BadRequestError, match="only a response still being generated can be cancelled"):
        c.responses.cancel(seen["id"])


@pytest.mark.parametrize("field,value,message", [
    ("frobnicate", 1, "unknown field 'frobnicate' on /v1/responses"),
    ("tools", [{"type": "web_search"}], "'web_search' tools are not supported"),
    ("reasoning", {"effort": "high"}, "no reasoning-effort control"),
    ("include", ["reasoning.encrypted_content"], "never encrypted"),
    ("background", True, "background responses are not supported"),
    ("input", [{"type": "input_image", "role": "user"}], "'input_image' items are not supported"),
    ("input", [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "text-only"),
    ("max_output_tokens", 0, "'max_output_tokens' must be a positive integer"),
    ("text", {"format": {"type": "xml"}}, "'text.format' must be"),
])
def test_what_the_server_cannot_honour_is_a_400_naming_it(server, field, value, message):
    body = {"model": "byte", "input": "hi", "max_output_tokens": 2, field: value}
    reply = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and error["param"].split(".")[0] in (field, "input")
