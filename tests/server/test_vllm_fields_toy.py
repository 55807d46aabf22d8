"""vLLM / OpenAI request and response fields through the official openai client (typed responses
parse), against the real server process over the toy model: logit_bias, return_token_ids,
prompt_logprobs, top_logprobs limits, continuous usage, cached_tokens, assistant prefill, chat echo,
system_fingerprint, vLLM metric names, model aliases, X-Api-Key."""
import re

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "hi"}]


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


def test_logit_bias_and_return_token_ids(toy_server):
    c = client(toy_server)
    out = c.completions.create(model="toy", prompt="abc", max_tokens=5, temperature=1.0, seed=1,
                               logit_bias={"7": 100}, extra_body={"return_token_ids": True, "ignore_eos": True})
    choice = out.choices[0]
    assert choice.text == "hhhhh" and choice.model_extra["token_ids"] == [7] * 5
    assert choice.model_extra["prompt_token_ids"] == httpx.post(toy_server.url + "/tokenize",
                                                                json={"prompt": "abc"}).json()["tokens"]
    chat = c.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=4, logit_bias={"9": 100},
                                     seed=2, extra_body={"return_token_ids": True, "ignore_eos": True})
    assert chat.choices[0].message.content == "jjjj" and chat.choices[0].model_extra["token_ids"] == [9] * 4
    assert chat.model_extra["prompt_token_ids"] == [1 + ord(ch) % 60 for ch in "<user>hi<assistant>"]
    chat_chunks = list(c.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=3, stream=True,
                                                 extra_body={"return_token_ids": True, "ignore_eos": True}))
    assert chat_chunks[0].model_extra["prompt_token_ids"] == chat.model_extra["prompt_token_ids"]
    assert len(sum((ch.choices[0].model_extra.get("token_ids") or [] for ch in chat_chunks), [])) == 3
    streamed = list(c.completions.create(model="toy", prompt="abc", max_tokens=5, temperature=0, stream=True,
                                         extra_body={"return_token_ids": True}))
    ids = sum((ch.choices[0].model_extra["token_ids"] for ch in streamed), [])
    assert len(ids) == 5 and streamed[0].choices[0].model_extra["prompt_token_ids"] == choice.model_extra[
        "prompt_token_ids"]


def test_prompt_logprobs_and_top_logprobs_limits(toy_server):
    c = client(toy_server)
    out = c.completions.create(model="toy", prompt="abcd", max_tokens=2, extra_body={"prompt_logprobs": 3})
    plp = out.choices[0].model_extra["prompt_logprobs"]
    prompt_ids = httpx.post(toy_server.url + "/tokenize", json={"prompt": "abcd"}).json()["tokens"]
    assert len(plp) == len(prompt_ids) and plp[0] is None
    for token, entry in zip(prompt_ids[1:], plp[1:]):
        assert str(token) in entry and len(entry) >= 3
        assert all(v["logprob"] <= 0 and v["rank"] >= 1 for v in entry.values())
    chat = c.chat.completions.create(model="toy", messages=MESSAGES, max_tokens=2, logprobs=True, top_logprobs=20,
                                     extra_body={"prompt_logprobs": 0})
    assert len(chat.choices[0].logprobs.content[0].top_logprobs) == 20
    assert chat.model_extra["prompt_logprobs"][0] is None and len(chat.model_extra["prompt_logprobs"]) > 5
    for body in ({"prompt_logprobs": 21}, {"prompt_logprobs": -1}, {"logprobs": 21}):
        r = httpx.post(toy_server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(body)), r.text


def test_continuous_usage_stats_and_cached_tokens(toy_server):
    c = client(toy_server)
    prompt = "a long shared prefix for the cache " * 2
    first = c.completions.create(model="toy", prompt=prompt, max_tokens=3)
    second = c.completions.create(model="toy", prompt=prompt, max_tokens=3)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens_details.cached_tokens
    chunks = list(c.completions.create(model="toy", prompt="xyz", max_tokens=6, stream=True,
                                       stream_options={"include_usage": True, "continuous_usage_stats": True},
                                       extra_body={"ignore_eos": True}))
    with_choices = [ch for ch in chunks if ch.choices]
    assert all(ch.usage is not None for ch in with_choices)
    tokens = [ch.usage.completion_tokens for ch in with_choices]
    assert tokens == sorted(tokens) and tokens[-1] == 6 and chunks[-1].usage.total_tokens == 9
    assert not chunks[-1].choices


def test_assistant_prefill_chat_echo_and_system_fingerprint(toy_server):
    c = client(toy_server)
    prefill = MESSAGES + [{"role": "assistant", "content": "abc"}]
    ids = httpx.post(toy_server.url + "/tokenize", json={"messages": prefill, "continue_final_message": True,
                                                         "add_generation_prompt": False}).json()["tokens"]
    assert ids == [1 + ord(ch) % 60 for ch in "<user>hi<assistant>abc"]
    out = c.chat.completions.create(model="toy", messages=prefill, max_tokens=3, temperature=0,
                                    extra_body={"continue_final_message": True, "add_generation_prompt": False,
                                                "echo": True, "ignore_eos": True})
    assert out.choices[0].message.content.startswith("abc") and len(out.choices[0].message.content) == 6
    assert out.system_fingerprint and out.system_fingerprint.startswith("gh200rt-")
    streamed = list(c.chat.completions.create(model="toy", messages=prefill, max_tokens=3, temperature=0,
                                              stream=True, extra_body={"continue_final_message": True,
                                                                       "echo": True, "ignore_eos": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed) == out.choices[0].message.content
    assert all(ch.system_fingerprint == out.system_fingerprint for ch in streamed)
    bad = httpx.post(toy_server.url + "/v1/chat/completions", json={
        "messages": MESSAGES, "continue_final_message": True, "max_tokens": 2})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "continue_final_message"


def test_vllm_metric_names_beside_gh200rt_names(toy_server):
    client(toy_server).completions.create(model="toy", prompt="metrics", max_tokens=4)
    text = httpx.get(toy_server.url + "/metrics").text

    def value(name):
        return float(re.search(rf'^{re.escape(name)}{{model_name="toy"}} (\S+)$', text, re.M).group(1))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"):
        assert 0 <= value(name)
    assert value("vllm:generation_tokens_total") == float(
        re.search(r"^gh200rt_generation_tokens_total (\S+)$", text, re.M).group(1)) > 0
    assert value("vllm:prompt_tokens_total") > 0
    assert re.search(r'^vllm:request_success_total{model_name="toy",finished_reason="length"} [1-9]', text, re.M)
    for name in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_inference_time_seconds", "request_prompt_tokens", "request_generation_tokens",
                 "request_max_num_generation_tokens", "request_params_n", "request_params_max_tokens",
                 "iteration_tokens_total"):
        assert re.search(rf'^vllm:{name}_bucket{{model_name="toy",le="\+Inf"}} [1-9]', text, re.M), name
        assert re.search(rf'^vllm:{name}_count{{model_name="toy"}} [1-9]', text, re.M), name
    assert "gh200rt_time_to_first_token_seconds_bucket" in text
    # max_tokens=4: a request's 4 generated tokens fall in the le="5" bucket and not in le="2"
    count = lambda name, le: float(re.search(  # noqa: E731
        rf'^vllm:{name}_bucket{{model_name="toy",le="{le}"}} (\S+)$', text, re.M).group(1))
    assert count("request_generation_tokens", "5") > count("request_generation_tokens", "2")
    assert count("request_params_max_tokens", "5") >= 1
    assert re.search(r'^vllm:num_requests_waiting_by_reason{model_name="toy",reason="capacity"} \d', text, re.M)
    assert re.search(r'^vllm:num_requests_waiting_by_reason{model_name="toy",reason="deferred"} 0', text, re.M)
    info = re.search(r'^vllm:cache_config_info{model_name="toy",(.*)} 1.0$', text, re.M)
    assert info and 'block_size="' in info.group(1) and 'num_gpu_blocks="' in info.group(1), text[-3000:]


def test_model_aliases_and_x_api_key(start_toy_server):
    server = start_toy_server("--served-model-name", "main", "alias", "--api-key", "k3y")
    headers = {"X-Api-Key": "k3y"}
    models = httpx.get(server.url + "/v1/models", headers=headers).json()["data"]
    assert [m["id"] for m in models] == ["main", "alias"]
    for name in ("main", "alias"):
        out = client(server, api_key="k3y").completions.create(model=name, prompt="a", max_tokens=2)
        assert out.model == "main"
    body = {"prompt": "a", "max_tokens": 2}
    assert httpx.post(server.url + "/v1/completions", json=body, headers=headers).status_code == 200
    assert httpx.post(server.url + "/v1/completions", json=body, headers={"X-Api-Key": "nope"}).status_code == 401
    assert httpx.post(server.url + "/v1/completions", json={**body, "model": "other"},
                      headers=headers).status_code == 404
    assert httpx.get(server.url + "/metrics", headers=headers).text.count("model_name=\"main\"") > 10
