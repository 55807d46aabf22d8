"""Acceptance against ``python -m gh200rt.serve`` with real models over loopback: a tiny random
Llama directory (fast: errors, load with disconnects, SIGTERM) and the default SmolLM2 GGUF
(the official openai client, streamed text == non-streamed text at temperature 0)."""
import asyncio
import json
import os

import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it
openai = pytest.importorskip("openai")

from tests.engine.real_models import save_tiny_llama, smollm2_gguf  # noqa: E402
from tests.server.helpers import ServerProcess, check_drained, check_streams_with_disconnects, sigterm_during_streams  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}<s> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}w3 {% endif %}")


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    path = save_tiny_llama(str(tmp_path_factory.mktemp("tiny-llama")))
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    with open(config_path, "w") as f:
        json.dump({**config, "chat_template": CHAT_TEMPLATE}, f)
    return path


def serve(model_dir, *extra):
    return ServerProcess("gh200rt.serve", ["--model", model_dir, "--served-model-name", "tiny",
                                           "--max-model-len", "128", *extra])


@pytest.fixture(scope="module")
def tiny_server(tiny_llama_dir):
    server = serve(tiny_llama_dir)
    yield server
    server.stop()


def _parity(c, model, prompt, messages, max_tokens):
    full = c.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    chunks = list(c.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == full.choices[0].text
    assert chunks[-1].usage.model_dump() == full.usage.model_dump()
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    chat = c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    streamed = list(c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                              stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed) == chat.choices[0].message.content
    assert [ch.choices[0].delta.role for ch in streamed if ch.choices[0].delta.role] == ["assistant"]
    assert sum(1 for ch in streamed if ch.choices[0].finish_reason) == 1
    return full, chat


def test_tiny_llama_openai_parity_and_errors(tiny_server):
    c = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="none", max_retries=0)
    full, _ = _parity(c, "tiny", "w5 w6 w7", [{"role": "user", "content": "w9 w10"}], 10)
    assert full.usage.prompt_tokens == 3
    for body in ({"prompt": "w5 " * 120, "max_tokens": 20}, {"prompt": [5, 256]}, {"prompt": [5], "max_tokens": 200},
                 {"prompt": "w5", "logprobs": 21}):
        r = httpx.post(tiny_server.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["message"], (body, r.text)
    assert httpx.get(tiny_server.url + "/health").status_code == 200


def test_tiny_llama_64_streams_third_disconnected(tiny_server):
    check_streams_with_disconnects(tiny_server, timeout=120)


def test_tiny_llama_sigterm_during_load(tiny_llama_dir):
    # Streams whose first chunk has arrived and that have ~200 steps to go are still generating when
    # the late request is sent, whatever the machine's speed; the helper checks it from the server's
    # own pending count rather than trusting a sleep.
    server = ServerProcess("gh200rt.serve", ["--model", tiny_llama_dir, "--max-model-len", "256",
                                             "--shutdown-timeout", "120"])
    try:
        bodies = [{"prompt": f"w{i + 4} w5", "max_tokens": 200, "ignore_eos": True,
                   "stream_options": {"include_usage": True}} for i in range(8)]
        check_drained(asyncio.run(sigterm_during_streams(server, bodies, exit_within=30)), 200)
    finally:
        server.stop()


def test_smollm2_openai_client_parity():
    server = ServerProcess("gh200rt.serve", ["--model", smollm2_gguf(), "--served-model-name", "smollm2",
                                             "--max-model-len", "512"], ready_timeout=240)
    try:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=240)
        full, chat = _parity(c, "smollm2", "The capital of France is", [{"role": "user", "content": "Say hi."}], 8)
        assert full.choices[0].text.strip()
        assert chat.choices[0].message.content.strip()
    finally:
        server.stop()


# Issue 27's acceptance: each asked plain, streamed, plain, streamed at temperature 0; the later three find the
# chat template's system prompt and their own earlier prompt in the prefix cache. Before prefix-cache invariance,
# "Say hi." answered "Hello there! ..." cold and "I'm here to help ..." from the cache on the bf16 route (the
# first token differs, so 16 tokens show it). Four questions per route (the engine's invariance tests check the bits
# of more prompts on every route, tests/engine/test_invariance.py).
CHAT_QUESTIONS = ("Say hi.", "What is the capital of France?", "Write a haiku about the sea.", "What is 17 times 23?")


@pytest.mark.slow
def test_smollm2_chat_answers_do_not_depend_on_the_prefix_cache(cpu_route):
    if cpu_route.portable:
        pytest.skip("the portable native build is forced inside the test process only, not in a server")
    server = ServerProcess("gh200rt.serve", ["--model", smollm2_gguf(), "--served-model-name", "smollm2",
                                             "--max-model-len", "512", "--cpu-route", cpu_route.cpu_route],
                           ready_timeout=240)
    try:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=240)
        for question in CHAT_QUESTIONS:
            body = dict(model="smollm2", messages=[{"role": "user", "content": question}], max_tokens=16,
                        temperature=0)
            answers, cached = [], []
            for stream in (False, True, False):          # cold, then twice from the prefix cache
                if stream:
                    chunks = list(c.chat.completions.create(**body, stream=True))
                    answers.append("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices))
                else:
                    reply = c.chat.completions.create(**body)
                    answers.append(reply.choices[0].message.content)
                    cached.append(reply.usage.prompt_tokens_details.cached_tokens)
            assert cached[-1] > 0, "the repeated question did not hit the prefix cache"
            assert len(set(answers)) == 1, f"{cpu_route.name}: {question!r} got {len(set(answers))} answers: {answers}"
    finally:
        server.stop()


def test_unloadable_model_exits_1_with_clear_message(tmp_path):
    import subprocess
    import sys
    from tests.server.helpers import ROOT, free_port
    proc = subprocess.run([sys.executable, "-m", "gh200rt.serve", "--model", str(tmp_path / "missing"), "--port",
                           str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "could not be loaded" in proc.stderr and "missing" in proc.stderr
