"""``python -m gh200rt.serve`` serves tiny random MoE models (Mixtral's layout with streamed layers and experts,
DeepSeek-V3's with streamed experts): a completion over loopback equals the engine's greedy tokens for the same
prompt, and /metrics shows the experts per tier, the bytes of the routed experts copied in and the routing counts."""
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
