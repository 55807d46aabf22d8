"""``python -m gh200rt.serve`` over a tiny random Llama with one streamed layer and a tokenizer that
adds BOS: the start-up log shows the platform and the plan, /metrics exports the weight placement,
/v1/models has vLLM's shape, and a chat prompt carries exactly one BOS."""
import json
import os

import pytest
from tokenizers import Tokenizer, processors

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

from tests.engine.real_models import save_tiny_llama  # noqa: E402
from tests.server.helpers import ServerProcess, metric  # noqa: E402

TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}w3{% endif %}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = save_tiny_llama(str(tmp_path_factory.mktemp("tiny-llama-bos")))
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    tok.add_special_tokens(["<s>", "</s>"])           # as real tokenizers do: "<s>" in text is one token
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(os.path.join(path, "tokenizer.json"))
    config_path = os.path.join(path, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    with open(config_path, "w") as f:
        json.dump({**config, "chat_template": TEMPLATE}, f)
    s = ServerProcess("gh200rt.serve", ["--model", path, "--served-model-name", "tiny", "--max-model-len", "128",
                                        "--layer-tiers", "1:streamed", "--log-level", "info"])
    yield s
    s.stop()


def test_startup_log_shows_platform_and_plan(server):
    log = server.read_log()
    assert "platform: cpu (profile cpu)" in log, log
    assert "plan for cpu (cpu)" in log and "1 resident, 1 streamed" in log, log
    lines = log.splitlines()
    assert any(line.split()[:2] == ["0", "resident"] for line in lines), log
    assert any(line.split()[:2] == ["1", "streamed"] for line in lines), log
    assert "serving tiny at http://127.0.0.1:" in log


def test_metrics_export_weight_placement(server):
    before = metric(server, "weight_bytes_copied_total")
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "w5 w6", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    text = httpx.get(server.url + "/metrics").text
    for name, kind in (("weight_layers", "gauge"), ("weight_bytes_copied_total", "counter"),
                       ("copy_wait_seconds_total", "counter")):
        assert f"# TYPE gh200rt_{name} {kind}" in text and f"# HELP gh200rt_{name} " in text
    assert 'gh200rt_weight_layers{tier="resident"} 1' in text
    assert 'gh200rt_weight_layers{tier="streamed"} 1' in text
    assert 'gh200rt_weight_layers{tier="direct"} 0' in text
    assert metric(server, "weight_bytes_copied_total") > before      # the streamed layer was copied each step
    assert metric(server, "copy_wait_seconds_total") >= 0


def test_models_shape_like_vllm(server):
    listing = httpx.get(server.url + "/v1/models").json()
    assert listing["object"] == "list" and len(listing["data"]) == 1
    card = listing["data"][0]
    assert {k: card[k] for k in ("id", "object", "owned_by", "parent", "max_model_len")} == {
        "id": "tiny", "object": "model", "owned_by": "gh200rt", "parent": None, "max_model_len": 128}
    assert card["created"] > 1_600_000_000 and os.path.isdir(card["root"])
    assert httpx.get(server.url + "/v1/models/tiny").json() == card
    missing = httpx.get(server.url + "/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


def test_chat_prompt_carries_one_bos(server):
    messages = [{"role": "user", "content": "w5 w6"}]
    tokens = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["tokens"]
    assert tokens == [1, 5, 6, 3]                          # the template's BOS only, not a second from encode
    chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}).json()
    assert chat["usage"]["prompt_tokens"] == 4
    plain = httpx.post(server.url + "/tokenize", json={"prompt": "w5 w6"}).json()["tokens"]
    assert plain == [1, 5, 6]                              # a plain prompt gets the tokenizer's BOS
    bare = httpx.post(server.url + "/tokenize", json={"prompt": "w5 w6", "add_special_tokens": False}).json()
    assert bare["tokens"] == [5, 6]
