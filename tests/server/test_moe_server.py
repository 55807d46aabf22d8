"""``python -m gh200rt.serve`` serves tiny random MoE models (Mixtral's layout with streamed layers and experts,
DeepSeek-V3's with streamed experts): a completion over loopback equals the engine's greedy tokens for the same
prompt, and /metrics shows the experts per tier, the bytes of the routed experts copied in and the routing counts; the
tiny DeepSeek-V3 answers with its reasoning and its tool calls split out by DeepSeek's parsers."""
import json
import os

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

from gh200rt.sampling_params import SamplingParams  # noqa: E402
from tests.engine.real_models import SharedModel  # noqa: E402
from tests.model.tiny_checkpoints import save_tiny  # noqa: E402
from tests.server.helpers import ServerProcess  # noqa: E402


def engine_text(path: str, prompt: str) -> str:
    """8 greedy tokens of ``prompt`` from the engine itself, as text."""
    shared = SharedModel(path)
    ids = shared.tokenizer.encode(prompt)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    return shared.llm(max_model_len=128).generate([ids], params)[0].outputs[0].text


def serve(path: str, name: str, *placement: str) -> ServerProcess:
    return ServerProcess("gh200rt.serve", ["--model", path, "--served-model-name", name, "--max-model-len", "128",
                                           "--dtype", "float32", *placement])


def complete(server: ServerProcess, name: str, prompt: str) -> dict:
    """One greedy completion of 8 tokens over loopback (status 200), its body."""
    reply = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": name, "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_serves_a_tiny_mixtral(tmp_path):
    path = str(tmp_path / "mixtral")
    save_tiny("mixtral", path)
    prompt = "w5 w9 w13 w17 w40"
    want = engine_text(path, prompt)
    server = serve(path, "tiny-moe", "--offload", "stream", "--layer-tiers", "0:experts=direct")
    try:
        body = complete(server, "tiny-moe", prompt)
        assert body["usage"]["completion_tokens"] == 8
        assert body["choices"][0]["text"] == want
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
        series = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("gh200rt_"))
        experts = 4 * 8                                        # tiny mixtral: 4 layers of 8 experts
        assert float(series['gh200rt_moe_experts{tier="direct"}']) == 8
        assert float(series['gh200rt_moe_experts{tier="streamed"}']) == experts - 8
        routed = [float(v) for k, v in series.items() if k.startswith("gh200rt_moe_routed_tokens_total{")]
        prompt_tokens = body["usage"]["prompt_tokens"]
        # each layer routes every prompt token and the 7 decode steps' tokens to k=2 experts
        assert len(routed) == experts and sum(routed) == 4 * 2 * (prompt_tokens + 7)
        assert float(series["gh200rt_expert_bytes_copied_total"]) > 0
    finally:
        server.stop()


def test_serves_a_tiny_deepseek_v3_with_streamed_experts(tmp_path):
    """DeepSeek-V3's layout (latent attention, group-limited routing, shared experts, a dense first layer) served
    with its routed experts streamed: a completion equals the engine's greedy tokens, and the experts are counted."""
    path = str(tmp_path / "deepseek")
    save_tiny("deepseek-v3", path)
    prompt = "w5 w9 w13 w17 w40 w41"
    want = engine_text(path, prompt)
    server = serve(path, "tiny-deepseek", "--moe-expert-tier", "stream")
    try:
        assert complete(server, "tiny-deepseek", prompt)["choices"][0]["text"] == want
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
        series = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("gh200rt_"))
        assert float(series['gh200rt_moe_experts{tier="streamed"}']) == 2 * 8     # layers 1-2, 8 experts each
        assert float(series["gh200rt_expert_bytes_copied_total"]) > 0
    finally:
        server.stop()


WEATHER_TOOL = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _rename_words(path: str, words: dict[int, str]) -> None:
    """Give the tokenizer's token ``id`` the text ``words[id]`` (the model's ids stay what they were)."""
    file = os.path.join(path, "tokenizer.json")
    with open(file) as f:
        tokenizer = json.load(f)
    vocab = tokenizer["model"]["vocab"]
    by_id = {i: w for w, i in vocab.items()}
    for token_id, word in words.items():
        del vocab[by_id[token_id]]
        vocab[word] = token_id
    with open(file, "w") as f:
        json.dump(tokenizer, f)


def test_a_tiny_deepseek_v3_reasons_and_calls_tools_in_its_own_format(tmp_path):
    """``--reasoning-parser deepseek_r1 --tool-call-parser deepseek_v3`` over the tiny V3 with streamed experts: the
    tokens it generates greedily are given the texts ``</think>`` and a call in DeepSeek-V3's format, so its answer
    is ``<reasoning></think> <content><call>``: the reasoning comes back as ``reasoning`` / ``reasoning_content``, the
    call as ``tool_calls`` read from the content only, streamed or not; ``include_reasoning: false`` leaves it out."""
    from gh200rt.serve.tokenizer_routes import chat_token_ids
    from tests.unit.test_tool_parsers import deepseek_v3_calls
    path = str(tmp_path / "deepseek")
    save_tiny("deepseek-v3", path)
    messages = [{"role": "user", "content": "w5 w9 w13 w17"}]
    shared = SharedModel(path)
    prompt = chat_token_ids(shared.tokenizer, messages, True, tools=WEATHER_TOOL)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ids = shared.llm(max_model_len=128).generate([prompt], params)[0].outputs[0].token_ids
    # three positions whose tokens appear nowhere else in the prompt or before them: the end of the reasoning, the
    # call, and the token that stops the answer
    fresh = [i for i in range(1, len(ids)) if ids[i] not in prompt and ids[i] not in ids[:i] and ids[i] > 2]
    end, call, stop = fresh[0], fresh[1], fresh[2]
    _rename_words(path, {ids[end]: "</think>",
                         ids[call]: deepseek_v3_calls(("get_weather", '{"city": "Paris"}'))})
    words = [f"w{t}" for t in ids]
    server = serve(path, "tiny-deepseek", "--moe-expert-tier", "stream", "--reasoning-parser", "deepseek_r1",
                   "--enable-auto-tool-choice", "--tool-call-parser", "deepseek_v3")
    request = {"model": "tiny-deepseek", "messages": messages, "tools": WEATHER_TOOL, "max_tokens": 12,
               "temperature": 0, "ignore_eos": True, "stop_token_ids": [ids[stop]]}
    try:
        reply = httpx.post(server.url + "/v1/chat/completions", timeout=60, json=request)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        message = choice["message"]
        assert message["reasoning_content"] == message["reasoning"]
        assert message["reasoning"].split() == words[:end]
        assert (message["content"] or "").split() == words[end + 1:call]
        assert choice["finish_reason"] == "tool_calls"
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == \
            [("get_weather", {"city": "Paris"})]
        with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60,
                          json={**request, "stream": True}) as streamed:
            deltas = [json.loads(line[6:])["choices"][0] for line in streamed.iter_lines()
                      if line.startswith("data: {")]
        reasoning = "".join(d["delta"].get("reasoning_content") or "" for d in deltas)
        content = "".join(d["delta"].get("content") or "" for d in deltas)
        calls = [c for d in deltas for c in d["delta"].get("tool_calls") or []]
        assert reasoning == message["reasoning"] and content.split() == words[end + 1:call]
        assert [c["function"]["name"] for c in calls] == ["get_weather"] and deltas[-1]["finish_reason"] == "tool_calls"
        quiet = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                           json={**request, "include_reasoning": False}).json()["choices"][0]["message"]
        assert "reasoning" not in quiet and "reasoning_content" not in quiet and quiet["tool_calls"]
        # the Responses API (vLLM's sampling extensions stop it where the chat request stops): a reasoning item, the
        # message, a function_call item, plain and streamed alike
        tools = [{"type": "function", **tool["function"]} for tool in WEATHER_TOOL]
        body = {"model": "tiny-deepseek", "input": messages, "tools": tools, "max_output_tokens": 12,
                "temperature": 0, "ignore_eos": True, "stop_token_ids": [ids[stop]]}
        for stream in (False, True):
            reply = httpx.post(server.url + "/v1/responses", timeout=60, json={**body, "stream": stream})
            assert reply.status_code == 200, reply.text
            events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
            response = events[-1]["response"] if stream else reply.json()
            output = response["output"]
            said = words[end + 1:call]          # a message item only where the answer has text beside the call
            assert [item["type"] for item in output] == ["reasoning", *(["message"] if said else []),
                                                         "function_call"], output
            assert output[0]["content"][0]["text"] == message["reasoning"]
            assert not said or output[1]["content"][0]["text"].split() == said
            assert (output[-1]["name"], json.loads(output[-1]["arguments"])) == ("get_weather", {"city": "Paris"})
            assert 0 < response["usage"]["output_tokens_details"]["reasoning_tokens"] <= end + 1
            if stream:
                reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
                assert reasoning == message["reasoning"]
    finally:
        server.stop()
