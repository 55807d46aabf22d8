"""The real SmolLM2-135M-Instruct GGUF behind ``python -m gh200rt.serve``: the openai SDK's typed
structured-output helper (``chat.completions.parse`` with a pydantic model) and a required tool call
round-trip, sampled and streamed, with the GGUF's own tokenizer driving the grammar."""
import json
from typing import Literal

import pydantic
import pytest

openai = pytest.importorskip("openai")  # the test extra: a bare GPU host need not have it

from tests.engine.real_models import smollm2_gguf  # noqa: E402
from tests.server.helpers import ServerProcess  # noqa: E402


class City(pydantic.BaseModel):
    # closed (additionalProperties: false): an open schema lets a sampled answer add properties until
    # max_tokens cuts it, and a cut tool call is content, not a tool call
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=20)
    country: Literal["France", "Italy", "Spain"]
    population_millions: int = pydantic.Field(ge=0, le=50)


@pytest.fixture(scope="module")
def smollm2():
    server = ServerProcess("gh200rt.serve", ["--model", smollm2_gguf(), "--served-model-name", "smollm2",
                                             "--max-model-len", "512"], ready_timeout=240)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=240)
    server.stop()


def test_sdk_parse_gives_a_typed_object(smollm2):
    for seed in range(3):
        out = smollm2.chat.completions.parse(
            model="smollm2", messages=[{"role": "user", "content": "Describe Paris as JSON."}],
            response_format=City, temperature=1.0, seed=seed, max_tokens=80)
        city = out.choices[0].message.parsed
        assert isinstance(city, City), out.choices[0].message.content
        assert out.system_fingerprint and out.usage.prompt_tokens_details.cached_tokens >= 0


def test_required_tool_call_streamed(smollm2):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": City.model_json_schema()}}]
    stream = smollm2.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Look up Rome."}], tools=tools,
        tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=4, max_tokens=100, stream=True)
    deltas = [d for ch in stream for c in ch.choices for d in (c.delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].function.name == "lookup"
    City.model_validate(json.loads(deltas[0].function.arguments))
