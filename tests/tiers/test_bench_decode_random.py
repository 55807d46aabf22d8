"""`python -m gh200rt.bench latency --random-model`: a model of an exact published shape with random weights
written on the host, run through the real engine per placement, with each row's roofline in the JSON."""
import json
import math
import tempfile
from pathlib import Path

from gh200rt.bench.random_model import SHAPES, config_of, layer_shapes, write_random_checkpoint
from gh200rt.loader.load import read_arch
from gh200rt.models.arch_config import ArchConfig
from tests.zygote import run_python

ROOT = Path(__file__).resolve().parents[2]


def test_llama3_8b_shape_has_the_published_parameter_count():
    cfg = config_of("llama3-8b")
    per_layer = sum(math.prod(shape) for shape in layer_shapes(cfg, 0).values())
    total = cfg["num_hidden_layers"] * per_layer + 2 * cfg["vocab_size"] * cfg["hidden_size"] + cfg["hidden_size"]
    assert total == 8_030_261_248  # Meta-Llama-3-8B


def test_written_directory_loads_with_its_shape_and_is_reused(tmp_path):
    path = write_random_checkpoint("llama3-tiny", str(tmp_path / "m"))
    arch = read_arch(path)
    assert (arch.hidden_size, arch.num_layers, arch.num_kv_heads) == (256, 4, 2)
    shard = tmp_path / "m" / "model-layer000.safetensors"
    before = shard.stat().st_mtime_ns
    write_random_checkpoint("llama3-tiny", path)
    assert shard.stat().st_mtime_ns == before, "a complete directory of the same shape is reused"
    assert set(SHAPES) >= {"llama3-8b", "llama3-tiny"}


def test_bench_decode_random_model_writes_rows_with_rooflines(tmp_path):
    out = tmp_path / "decode.json"
    proc = run_python(["-m", "gh200rt.bench", "latency", "--random-model", "llama3-tiny",
                           "--random-model-dir", str(tmp_path / "m"), "--placements", "resident,direct",
                           "--batches", "1", "--tokens", "3", "--json", str(out), "--host-profile", "4",
                           "--kernel-times", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the host profile: its 4 functions under each row
    assert proc.stdout.count("host profile over 2 steps") == 2 and proc.stdout.count(" ms with callees ") == 8
    report = json.loads(out.read_text())
    assert all(r["kernels_per_step"] > 0 and r["kernel_busy_ms"] is None for r in report["rows"])  # no GPU here
    assert report["model"] == "llama3-tiny" and [r["placement"] for r in report["rows"]] == ["resident", "direct"]
    assert [r["tiers"] for r in report["rows"]] == ["4/0/0", "0/0/4"]
    assert all(r["tokens_per_second"] > 0 and r["roofline_tokens_per_second"] > 0 for r in report["rows"])


def test_bench_decode_moe_counts_the_routed_experts_bytes(tmp_path):
    """An MoE model's experts-* placements: at batch 1 a step touches k=4 of the 16 experts of each layer, so
    the routed experts' bytes per step are a quarter of what streaming whole layers would move; cpu-tier experts
    move none."""
    out = tmp_path / "decode.json"
    proc = run_python(["-m", "gh200rt.bench", "latency", "--random-model", "qwen3-moe-tiny",
                           "--random-model-dir", str(tmp_path / "m"), "--placements",
                           "resident,experts-direct,experts-stream,experts-cpu", "--batches", "1", "--tokens", "3",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {r["placement"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["resident"]["experts"] == "64/0/0/0" and rows["resident"]["expert_link_bytes_per_step"] == 0
    assert rows["experts-direct"]["experts"] == "0/0/64/0" and rows["experts-stream"]["experts"] == "0/64/0/0"
    # computed where they live: nothing crosses a link
    assert rows["experts-cpu"]["experts"] == "0/0/0/64" and rows["experts-cpu"]["expert_link_bytes_per_step"] == 0
    for name in ("experts-direct", "experts-stream"):
        row = rows[name]
        assert row["expert_link_bytes_per_step"] == row["whole_layer_expert_bytes"] / 4, row
        assert row["roofline_tokens_per_second"] > 0


def test_bench_decode_graphs_times_eager_and_the_bucketed_path_side_by_side(tmp_path):
    out = tmp_path / "graphs.json"
    proc = run_python(["-m", "gh200rt.bench", "latency", "--random-model", "llama3-tiny",
                           "--random-model-dir", str(tmp_path / "m"), "--placements", "resident,stream",
                           "--batches", "1,3", "--tokens", "3", "--dtype", "float32", "--graphs", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["placement"], r["batch"], r["bucket"]) for r in rows] == \
        [("resident", 1, 1), ("resident", 3, 4), ("stream", 1, 1), ("stream", 3, 4)]
    assert all(r["eager_ms"] > 0 and r["graphs_ms"] > 0 and r["captures"] >= 1 for r in rows)
    assert "speed-up" in proc.stdout and "overhead ms" in proc.stdout


def test_warm_up_captures_every_timed_batchs_graph_before_timing(tmp_path):
    """On the CPU the bucketed graph path (--no-enforce-eager) captures lazily exactly as CUDA graphs do."""
    from gh200rt.bench.decode_rate import decode_rate, warm_up
    from gh200rt.config import EngineConfig
    from gh200rt.engine.engine import LLMEngine
    path = write_random_checkpoint("llama3-tiny", str(tmp_path / "m"))
    engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64,
                                                            num_kv_blocks=64, enforce_eager=False))
    try:
        assert decode_rate(engine, 3, 2).captures == 1, "without a warm-up bucket 4's capture falls in the timing"
        warm_up(engine, [1, 8])
        assert [decode_rate(engine, batch, 3).captures for batch in (1, 8)] == [0, 0]
    finally:
        engine.close()


def test_a_random_model_serves_structured_outputs(tmp_path):
    """The GPU kit's serve step sends a json_schema request to the random 8B shape: its tokenizer must say which
    bytes each token adds (a word-level one could not, and the request got a 400)."""
    from gh200rt.engine.llm import LLM
    from gh200rt.sampling_params import SamplingParams
    from gh200rt.structured import Constraint
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    path = write_random_checkpoint("llama3-tiny", str(tmp_path / "m"))
    llm = LLM(path, dtype="float32", max_model_len=128, num_kv_blocks=32)
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=40, structured_output=Constraint.json_schema(schema))
    out = llm.generate(["hello"], params)[0].outputs[0]
    assert out.finish_reason == "stop", out
    assert 0 <= json.loads(out.text)["n"] <= 99


def _parameters(shape: str) -> int:
    cfg = config_of(shape)
    per_layer = sum(math.prod(s) for s in layer_shapes(cfg, 0).values())
    return cfg["num_hidden_layers"] * per_layer + 2 * cfg["vocab_size"] * cfg["hidden_size"] + cfg["hidden_size"]


def test_moe_shapes_have_the_published_parameter_counts():
    assert _parameters("qwen3-30b-a3b") == 30_532_122_624    # Qwen/Qwen3-30B-A3B
    assert _parameters("mixtral-8x7b") == 46_702_792_704     # mistralai/Mixtral-8x7B-v0.1
    cut = config_of("qwen3-30b-a3b-8l")
    assert cut["num_hidden_layers"] == 8 and layer_shapes(cut, 0) == layer_shapes(config_of("qwen3-30b-a3b"), 0)
    arch = read_arch(str(ROOT / "tests" / "fixtures" / "qwen3_30b_a3b"))
    ours = ArchConfig.from_hf_config(config_of("qwen3-30b-a3b"))
    assert ours == arch, \
        "the shape differs from the published config.json in tests/fixtures/qwen3_30b_a3b"


def test_a_cut_moe_shape_writes_loads_and_generates(tmp_path):
    """qwen3-moe-tiny cut to 2 layers: Qwen3-MoE names and config fields the loader takes strictly, through the
    engine with streamed layers as with resident ones."""
    from gh200rt.engine.llm import LLM
    from gh200rt.sampling_params import SamplingParams
    path = write_random_checkpoint("qwen3-moe-tiny", str(tmp_path / "m"), num_layers=2)
    arch = read_arch(path)
    assert (arch.architecture, arch.num_layers, arch.num_experts, arch.moe_layers) == ("qwen3_moe", 2, 16, [0, 1])
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    tokens = {offload: LLM(path, dtype="float32", max_model_len=64, offload=offload).generate([[5, 6, 7]], greedy)
              [0].outputs[0].token_ids for offload in ("none", "stream")}
    assert len(tokens["none"]) == 4 and tokens["none"] == tokens["stream"], tokens


def test_bench_decode_context_prefills_long_prompts_and_counts_their_kv_in_the_roofline(tmp_path):
    # prompts of 300 tokens at batch 8 (2,400 positions) take more than one step's 2,048-token budget to prefill;
    # the roofline adds the K/V bytes each step reads, so it sits below the short-prompt one of the same run
    out_long, out_short = tmp_path / "long.json", tmp_path / "short.json"
    common = ["-m", "gh200rt.bench", "latency", "--random-model", "llama3-tiny",
              "--random-model-dir", str(tmp_path / "m"), "--placements", "resident", "--batches", "8", "--tokens", "4"]
    for extra, out in ((["--context", "300"], out_long), ([], out_short)):
        proc = run_python(common + extra + ["--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    long, short = (json.loads(p.read_text())["rows"][0] for p in (out_long, out_short))
    assert long["context"] == 300 and short["context"] == 4 and long["tokens_per_second"] > 0
    assert long["roofline_tokens_per_second"] < short["roofline_tokens_per_second"]
    refused = run_python(common + ["--context", "2"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--context 2: at least 4" in refused.stderr


def test_deepseek_v3_shapes_are_the_published_layers_and_generate():
    """deepseek-v3-cut keeps V3's layers exactly (latent attention, a dense layer, experts of V3's width; 16 of them)
    and its vocabulary; deepseek-v3-tiny loads strictly and generates the same tokens with its experts streamed."""
    from gh200rt.engine.llm import LLM
    from gh200rt.sampling_params import SamplingParams
    published = read_arch(str(ROOT / "tests" / "fixtures" / "deepseek_v3"))
    cut = ArchConfig.from_hf_config(config_of("deepseek-v3-cut"))
    same = ("hidden_size", "intermediate_size", "num_heads", "vocab_size", "moe_intermediate_size", "kv_lora_rank",
            "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "head_dim", "num_experts_per_tok",
            "shared_expert_intermediate_size", "routed_scaling_factor", "rope_scaling")
    assert all(getattr(cut, f) == getattr(published, f) for f in same), \
        [f for f in same if getattr(cut, f) != getattr(published, f)]
    assert (cut.num_layers, cut.num_experts, cut.moe_layers) == (2, 16, [1])
    cfg = config_of("deepseek-v3-cut")
    assert layer_shapes(cfg, 1)["model.layers.1.mlp.experts.15.down_proj.weight"] == (7168, 2048)
    with tempfile.TemporaryDirectory() as scratch:
        path = write_random_checkpoint("deepseek-v3-tiny", scratch)
        greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        tokens = {tier: LLM(path, dtype="float32", max_model_len=64, offload="none", moe_expert_tier=tier)
                  .generate([[5, 6, 7]], greedy)[0].outputs[0].token_ids for tier in ("resident", "stream")}
    assert len(tokens["resident"]) == 4 and tokens["resident"] == tokens["stream"], tokens
