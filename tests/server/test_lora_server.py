"""LoRA adapters through the real server (tiny random Llama, CPU): listing, choosing by model name, load and
unload at run time, vLLM's errors; and the routes are off without --enable-runtime-lora-updating."""
import re

import pytest

from tests.lora.peft_files import ATTENTION, merged_model, write_peft_adapter
from tests.lora.test_lora_parity import hf_greedy
from tests.model.tiny_checkpoints import save_tiny
from tests.server.helpers import ServerProcess, httpx

PROMPT = [5, 9, 17, 33, 4, 71, 8, 100]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    hf = save_tiny("llama3-gqa-untied", str(root / "model"))
    sql = write_peft_adapter(str(root / "sql"), hf, r=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"), seed=1)
    extra = write_peft_adapter(str(root / "extra"), hf, r=8, alpha=16, seed=2)
    big = write_peft_adapter(str(root / "big"), hf, r=32, alpha=16, targets=ATTENTION, seed=3)
    server = ServerProcess("gh200rt.serve", [
        "--model", str(root / "model"), "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "128",
        "--enable-lora", "--lora-modules", f"sql={sql}", '{"name": "sql2", "path": "%s", "base_model_name": "b"}' % sql,
        "--max-loras", "2", "--max-lora-rank", "8", "--enable-runtime-lora-updating"])
    yield {"server": server, "hf": hf, "sql": sql, "extra": extra, "big": big, "root": root}
    server.stop()


def complete(url, model, prompt=PROMPT):
    return httpx.post(url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 6,
                                                     "temperature": 0, "ignore_eos": True}, timeout=60)


def test_models_list_adapters_with_their_parent(setup):
    url = setup["server"].url
    cards = {c["id"]: c for c in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
    assert set(cards) == {"tiny", "sql", "sql2"}
    assert cards["sql"]["parent"] == "tiny" and cards["sql"]["root"] == setup["sql"]
    assert cards["sql2"]["parent"] == "b" and cards["tiny"]["parent"] is None
    assert httpx.get(url + "/v1/models/sql", timeout=10).json()["parent"] == "tiny"


def test_requests_choose_the_adapter_by_model_name(setup):
    url = setup["server"].url
    base, sql = complete(url, "tiny"), complete(url, "sql")
    assert base.status_code == 200 and sql.status_code == 200, sql.text
    assert sql.json()["model"] == "sql"
    want_sql = hf_greedy(merged_model(setup["hf"], setup["sql"]), PROMPT)[0][:6]
    want_base = hf_greedy(setup["hf"], PROMPT)[0][:6]
    tok = httpx.post(url + "/tokenize", json={"prompt": sql.json()["choices"][0]["text"],
                                              "add_special_tokens": False}, timeout=10).json()["tokens"]
    assert tok == want_sql and want_sql != want_base
    chat = httpx.post(url + "/v1/chat/completions", json={"model": "sql", "messages": [{"role": "user",
                      "content": "w5 w6"}], "max_tokens": 3}, timeout=60)
    assert chat.status_code == 200 and chat.json()["model"] == "sql"
    missing = complete(url, "nope")
    assert missing.status_code == 404 and "sql" in missing.json()["error"]["message"]


def test_embeddings_under_an_adapter_are_refused_not_run_on_the_base_model(setup):
    url = setup["server"].url
    assert httpx.post(url + "/v1/embeddings", json={"model": "tiny", "input": PROMPT}, timeout=60).status_code == 200
    r = httpx.post(url + "/v1/embeddings", json={"model": "sql", "input": PROMPT}, timeout=60)
    assert r.status_code == 400 and "LoRA adapter" in r.json()["error"]["message"], r.text


def test_load_and_unload_at_run_time(setup):
    url = setup["server"].url
    load = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "extra", "lora_path": setup["extra"]},
                      timeout=60)
    assert load.status_code == 200 and load.text == "Success: LoRA adapter 'extra' added successfully."
    assert "extra" in {c["id"] for c in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
    out = complete(url, "extra")
    assert out.status_code == 200 and out.json()["model"] == "extra"
    again = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "extra", "lora_path": setup["extra"]},
                       timeout=60)
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    unload = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "extra"}, timeout=60)
    assert unload.status_code == 200 and unload.text == "Success: LoRA adapter 'extra' removed successfully."
    assert complete(url, "extra").status_code == 404
    gone = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "extra"}, timeout=60)
    assert gone.status_code == 404 and "cannot be found" in gone.json()["error"]["message"]


@pytest.mark.parametrize("body,status,match", [
    ({"lora_name": "x"}, 400, "Both 'lora_name' and 'lora_path' must be provided."),
    ({"lora_name": "x", "lora_path": "/no/such/dir"}, 404, "no such directory"),
    ({"lora_name": "tiny", "lora_path": "/x"}, 400, "already been loaded"),
    ({"lora_name": "x", "lora_path": "/x", "load_inplace": True}, 400, "load_inplace"),
    ({"lora_name": "x", "lora_path": "/x", "lora_int_id": 3}, 400, "does not take"),
])
def test_load_errors(setup, body, status, match):
    r = httpx.post(setup["server"].url + "/v1/load_lora_adapter", json=body, timeout=60)
    assert r.status_code == status and match in r.json()["error"]["message"], r.text


def test_load_refuses_rank_above_max(setup):
    r = httpx.post(setup["server"].url + "/v1/load_lora_adapter", json={"lora_name": "big",
                   "lora_path": setup["big"]}, timeout=60)
    assert r.status_code == 400 and "--max-lora-rank" in r.json()["error"]["message"]


def test_runtime_updating_is_off_without_its_flag(setup):
    server = ServerProcess("gh200rt.serve", ["--model", str(setup["root"] / "model"), "--max-model-len", "128",
                                             "--enable-lora", "--lora-modules", f"sql={setup['sql']}"])
    try:
        r = httpx.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": setup["sql"]},
                       timeout=30)
        assert r.status_code == 404 and "--enable-runtime-lora-updating" in r.json()["error"]["message"]
        assert complete(server.url, "sql").status_code == 200
    finally:
        server.stop()


def _lora_info(url) -> tuple[dict[str, str], float] | None:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:lora_requests_info{"):
            labels, value = line[len("vllm:lora_requests_info{"):].rsplit("} ", 1)
            return dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)
    return None


def test_lora_requests_info_names_the_running_adapters(setup):
    """vLLM's gauge: running and waiting adapters and max_lora as labels, the time as the value."""
    import threading
    import time
    url = setup["server"].url
    requests = [threading.Thread(target=lambda: httpx.post(url + "/v1/completions", json={
        "model": "sql", "prompt": PROMPT, "max_tokens": 100, "ignore_eos": True}, timeout=120)) for _ in range(4)]
    for t in requests:
        t.start()
    seen = None
    deadline = time.time() + 60
    while time.time() < deadline and any(t.is_alive() for t in requests):
        info = _lora_info(url)
        if info is not None and info[0]["running_lora_adapters"] == "sql":
            seen = info
            break
    for t in requests:
        t.join()
    assert seen is not None, "no scrape saw the adapter running"
    labels, value = seen
    assert labels["max_lora"] == "2" and labels["waiting_lora_adapters"] in ("", "sql")
    assert abs(value - time.time()) < 120
    deadline = time.time() + 10      # the engine publishes its stats a moment after the last response
    while (labels := _lora_info(url)[0])["running_lora_adapters"] and time.time() < deadline:
        time.sleep(0.05)
    assert labels["running_lora_adapters"] == "" and labels["waiting_lora_adapters"] == ""
