"""Tools through Anthropic's Messages API and the official ``anthropic`` client, on the tiny byte-level Llama (random
weights: every valid call is the grammar's doing) served with ``--tool-call-parser hermes``: ``any`` and ``tool``
choices give ``tool_use`` blocks whose input validates, streamed or not; a tool_result fed back reaches the template
and the conversation goes on; count_tokens counts the tools' prompt too."""
import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")

from tests.server.byte_llama import serve_byte_llama  # noqa: E402

ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"], "properties": {
    "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}}}
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"], "properties": {
    "city": {"type": "string", "maxLength": 8}}}
TOOLS = [{"name": "add", "description": "add two numbers", "input_schema": ADD},
         {"name": "get_weather", "input_schema": WEATHER, "cache_control": {"type": "ephemeral"}}]
SCHEMAS = {"add": ADD, "get_weather": WEATHER}
ASK = [{"role": "user", "content": "what is 2 + 3?"}]
SAMPLED = {"temperature": 1.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = serve_byte_llama(tmp_path_factory, "--max-model-len", "1024", "--enable-auto-tool-choice",
                         "--tool-call-parser", "hermes")
    yield s
    s.stop()


def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)


def check_uses(message, only: str | None = None):
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses and message.stop_reason == "tool_use", message
    for use in uses:
        assert use.id.startswith("toolu_") and (only is None or use.name == only)
        jsonschema.validate(use.input, SCHEMAS[use.name])
    return uses


@pytest.mark.parametrize("stream", [False, True])
def test_any_and_tool_choices_give_tool_use_blocks(server, stream):
    c = client(server)
    for choice, only in (({"type": "tool", "name": "add"}, "add"),
                         ({"type": "any", "disable_parallel_tool_use": True}, None)):
        kw = dict(model="byte", max_tokens=200, messages=ASK, tools=TOOLS, tool_choice=choice, extra_body=SAMPLED)
        if stream:
            with c.messages.stream(**kw) as s:
                message = s.get_final_message()
        else:
            message = c.messages.create(**kw)
        assert len(check_uses(message, only)) == 1


def test_a_tool_round_trip(server):
    c = client(server)
    first = c.messages.create(model="byte", max_tokens=200, messages=ASK, tools=TOOLS,
                              tool_choice={"type": "tool", "name": "add"}, extra_body=SAMPLED)
    use = check_uses(first, "add")[0]
    answer = use.input["a"] + use.input["b"]

    def with_result(text: str) -> list[dict]:
        return ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                    "content": [{"type": "text", "text": text}]}]}]
    history = with_result(f"{answer}")
    second = c.messages.create(model="byte", max_tokens=4, messages=history, tools=TOOLS,
                               tool_choice={"type": "none"})
    assert second.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in second.content)
    counted = c.messages.count_tokens(model="byte", messages=history, tools=TOOLS).input_tokens
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == counted
    # the result reaches the template (one byte-level token per "x"), the call and the tools too
    longer = c.messages.count_tokens(model="byte", messages=with_result(f"{answer}" + "x" * 20), tools=TOOLS)
    assert longer.input_tokens == counted + 20
    asked = c.messages.count_tokens(model="byte", messages=ASK, tools=TOOLS).input_tokens
    bare = c.messages.count_tokens(model="byte", messages=ASK).input_tokens
    assert counted > asked + len('"name": "add"') and asked > bare + 50


def test_auto_needs_no_call(server):
    """``auto`` runs the Hermes parser over free text; random text holds no call, so the answer is text."""
    out = client(server).messages.create(model="byte", max_tokens=5, messages=ASK, tools=TOOLS, extra_body=SAMPLED)
    assert out.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in out.content)
