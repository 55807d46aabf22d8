"""``python -m gh200rt.serve`` serves a tiny random MoE model (Mixtral layout, streamed layers): one completion
over loopback equals the engine's greedy tokens for the same prompt."""
import pytest

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

from gh200rt.sampling_params import SamplingParams  # noqa: E402
from tests.engine.real_models import SharedModel  # noqa: E402
from tests.model.tiny_checkpoints import save_tiny  # noqa: E402
from tests.server.helpers import ServerProcess  # noqa: E402


def test_serves_a_tiny_mixtral(tmp_path):
    path = str(tmp_path / "mixtral")
    save_tiny("mixtral", path)
    prompt = "w5 w9 w13 w17 w40"
    shared = SharedModel(path)
    ids = shared.tokenizer.encode(prompt)
    want = shared.llm(max_model_len=128).generate([ids], SamplingParams(temperature=0, max_tokens=8,
                                                                        ignore_eos=True))[0].outputs[0].text
    server = ServerProcess("gh200rt.serve", ["--model", path, "--served-model-name", "tiny-moe",
                                             "--max-model-len", "128", "--dtype", "float32",
                                             "--offload", "stream"])
    try:
        reply = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": "tiny-moe", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["usage"]["completion_tokens"] == 8
        assert body["choices"][0]["text"] == want
    finally:
        server.stop()
