"""POST /v1/embeddings against the real server process over the toy model: float and base64, list and token-id
inputs, usage and index, the 400s, the same vector beside concurrent generation and under chunked prefill (checked
against the in-process engine with nothing else running), the routes without /v1 and /invocations, metrics, and
OpenAI's Python client.

The toy tokenizer maps a character c to the id 1 + ord(c) % 60; the toy model's hidden size is 16."""
import base64
import struct
import threading

import pytest
import torch

httpx = pytest.importorskip("httpx")  # the test extra: a bare GPU host need not have it

from gh200rt.config import EngineConfig  # noqa: E402
from gh200rt.engine.engine import LLMEngine  # noqa: E402
from gh200rt.engine.llm import LLM  # noqa: E402
from gh200rt.serve.embeddings import encode  # noqa: E402
from tests.engine.toy_model import ToyArch, ToyModel, ToyTokenizer  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog " * 2
HIDDEN = 16


def ids_of(text: str) -> list[int]:
    return [1 + ord(c) % 60 for c in text]


def embed(server, body: dict, path: str = "/v1/embeddings") -> dict:
    r = httpx.post(server.url + path, json={"model": "toy", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def vectors(server, body: dict) -> list[list[float]]:
    return [d["embedding"] for d in embed(server, body)["data"]]


def refused(server, body: dict, param: str) -> str:
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "toy", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    return r.json()["error"]["message"]


def reference(pooling: str, inputs: list[list[int]]) -> list[torch.Tensor]:
    """The engine in this process, unchunked, nothing else running (the toy server's weights: seed 0)."""
    arch = ToyArch(max_position_embeddings=256)
    cfg = EngineConfig.from_kwargs(num_kv_blocks=256, block_size=4, max_model_len=256, pooling_type=pooling)
    llm = LLM.from_engine(LLMEngine(ToyModel(arch), ToyTokenizer(), arch, cfg))
    return [torch.tensor(out.outputs.embedding) for out in llm.embed(inputs)]


def assert_close(got, want: torch.Tensor) -> None:
    got = torch.as_tensor(got)
    assert torch.allclose(got, want, rtol=0, atol=1e-6), float((got - want).abs().max())


def test_response_float_base64_lists_and_token_ids(toy_server):
    body = embed(toy_server, {"input": TEXT, "user": "someone"})
    assert body["object"] == "list" and body["model"] == "toy"
    assert body["usage"] == {"prompt_tokens": len(TEXT), "total_tokens": len(TEXT)}
    [item] = body["data"]
    assert item["object"] == "embedding" and item["index"] == 0 and len(item["embedding"]) == HIDDEN
    vector = torch.tensor(item["embedding"])
    assert abs(float(vector.norm()) - 1) < 1e-6                         # L2-normalised by default
    want = reference("LAST", [ids_of(TEXT), ids_of("ab")])
    assert_close(vector, want[0])
    # repeated inputs reuse cached prefix blocks, and the toy model is not prefix-cache invariant: within 1e-6
    packed = embed(toy_server, {"input": TEXT, "encoding_format": "base64"})["data"][0]["embedding"]
    assert_close(struct.unpack(f"<{HIDDEN}f", base64.b64decode(packed)), want[0])
    assert_close(vectors(toy_server, {"input": ids_of(TEXT)})[0], want[0])
    many = embed(toy_server, {"input": ["ab", TEXT, "cde"]})
    assert [d["index"] for d in many["data"]] == [0, 1, 2] and many["usage"]["prompt_tokens"] == 5 + len(TEXT)
    assert_close(many["data"][0]["embedding"], want[1])
    assert_close(many["data"][1]["embedding"], want[0])
    for got, expected in zip(vectors(toy_server, {"input": [ids_of("ab"), ids_of(TEXT)]}), want[::-1]):
        assert_close(got, expected)
    raw = torch.tensor(vectors(toy_server, {"input": TEXT, "normalize": False})[0])
    assert abs(float(raw.norm()) - 1) > 1e-3
    assert_close(raw / raw.norm(), want[0])
    assert_close(vectors(toy_server, {"input": TEXT, "dimensions": HIDDEN})[0], want[0])


def test_base64_is_little_endian_float32_exactly():
    vector = [0.1, -2.5, 3.0e-8, 1.0]
    packed = base64.b64decode(encode(vector, "base64"))
    assert packed == struct.pack("<4f", *vector)
    assert list(struct.unpack("<4f", packed)) == [struct.unpack("<f", struct.pack("<f", v))[0] for v in vector]


def test_refusals(toy_server):
    refused(toy_server, {"input": ""}, "input")
    refused(toy_server, {"input": []}, "input")
    refused(toy_server, {"input": [[]]}, "input")
    refused(toy_server, {}, "input")
    refused(toy_server, {"input": [64, 3]}, "input")                      # outside the vocabulary
    message = refused(toy_server, {"input": "x" * 300}, "input")
    assert "300 tokens" in message and "max_model_len is 256" in message
    assert embed(toy_server, {"input": "x" * 300, "truncate_prompt_tokens": -1})["usage"]["prompt_tokens"] == 256
    assert embed(toy_server, {"input": "x" * 300, "truncate_prompt_tokens": 7})["usage"]["prompt_tokens"] == 7
    assert "cannot" in refused(toy_server, {"input": "hi", "dimensions": 8}, "dimensions")
    refused(toy_server, {"input": "hi", "encoding_format": "int8"}, "encoding_format")
    refused(toy_server, {"input": "hi", "temperature": 0}, "temperature")   # unknown to embeddings: not ignored
    refused(toy_server, {"input": "hi", "messages": []}, "messages")
    refused(toy_server, {"input": "hi", "user": 7}, "user")
    r = httpx.post(toy_server.url + "/v1/embeddings", json={"model": "other", "input": "hi"}, timeout=60)
    assert r.status_code == 404, r.text


def test_routes_without_prefix_and_metrics(toy_server):
    def successes() -> tuple[float, float]:
        text = httpx.get(toy_server.url + "/metrics", timeout=60).text
        return tuple(float(next(line.split()[-1] for line in text.splitlines() if line.startswith(prefix)))
                     for prefix in ("gh200rt_requests_success_total ", 'vllm:request_success_total{model_name="toy",'
                                                                        'finished_reason="stop"}'))
    before = successes()
    want = torch.tensor(vectors(toy_server, {"input": "route"})[0])
    for path in ("/embeddings", "/invocations"):      # the toy model is not prefix-cache invariant: within 1e-6
        assert_close(embed(toy_server, {"input": "route"}, path)["data"][0]["embedding"], want)
    assert successes() == (before[0] + 3, before[1] + 3)


def test_same_vector_beside_concurrent_generation(toy_server):
    alone = vectors(toy_server, {"input": TEXT})[0]
    results = []

    def generate():
        r = httpx.post(toy_server.url + "/v1/completions", timeout=60, json={
            "model": "toy", "prompt": "abcdefgh" * 4, "max_tokens": 60, "temperature": 0, "ignore_eos": True})
        results.append(r.status_code)
    threads = [threading.Thread(target=generate) for _ in range(4)]
    for t in threads:
        t.start()
    mixed = [vectors(toy_server, {"input": [TEXT, "xyz"]})[0] for _ in range(3)]
    for t in threads:
        t.join()
    assert results == [200] * 4
    for vector in mixed:
        assert_close(vector, torch.tensor(alone))


@pytest.mark.parametrize("pooling", ["LAST", "MEAN"])
def test_chunked_prefill_pools_the_same(start_toy_server, pooling):
    server = start_toy_server("--max-num-batched-tokens", "8", "--pooling-type", pooling)
    inputs = [ids_of(TEXT), ids_of("x" * 250), ids_of("ab")]
    for got, want in zip(vectors(server, {"input": inputs}), reference(pooling, inputs)):
        assert_close(got, want)


def test_openai_client(toy_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=toy_server.url + "/v1", api_key="unused")
    want = vectors(toy_server, {"input": [TEXT, "ab"]})
    reply = client.embeddings.create(model="toy", input=[TEXT, "ab"])           # the client asks for base64
    assert len(reply.data) == 2 and reply.usage.prompt_tokens == len(TEXT) + 2
    for got, expected in zip([d.embedding for d in reply.data], want):
        assert_close(got, torch.tensor(expected))
    reply = client.embeddings.create(model="toy", input=ids_of("ab"), encoding_format="float")
    assert_close(reply.data[0].embedding, torch.tensor(want[1]))
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="toy", input="ab", dimensions=4)
