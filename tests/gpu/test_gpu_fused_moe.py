"""The fused MoE kernels compiled on a GPU: against their reference per host format with experts of one layer
split between HBM and host memory, and an engine whose experts are read in place (direct) generating what the
all-resident engine generates, decode steps captured in CUDA graphs.

Marked ``gpu``: skipped here, run by the GPU test matrix (scripts/validate_gpu.py).
"""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import assert_same_or_near_tie
from tests.kernels.test_fused_moe import H, make_case

pytestmark = pytest.mark.gpu

# Relative to the largest output. float32 activations: tl.dot runs in TF32 (10-bit mantissa), ~1e-3 per
# product for float32 and dequantized group weights; bf16 activations add bf16 roundings (2^-8) of gate_up,
# silu, the expert output and the scaled output, as the torch path rounds them, a few of which may differ.
TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 3e-2}
FORMATS = ["float32", "bfloat16", "float16", "int8", "int8-g32", "int4", "int4-g64", "fp8"]


def split_between_hbm_and_host(weights):
    """Even experts in HBM, odd ones in pinned host memory (what the kernels read in place over the link)."""
    def move(w, e):
        place = (lambda t: t.cuda()) if e % 2 == 0 else (lambda t: t.pin_memory())
        if isinstance(w, torch.Tensor):
            return place(w)
        return w.with_tensors({name: place(t) for name, t in w.tensors().items()})
    return [move(w, e) for e, w in enumerate(weights)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tokens", [1, 3, 17, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_on_cuda_matches_reference(compiled_triton, fmt, tokens, dtype):
    from gh200rt.kernels.triton.fused_moe import fused_moe, reference_fused_moe
    from gh200rt.kernels.triton.fused_moe_operands import expert_stack
    x, weights, ids, gate_up, down = make_case(fmt, tokens, num_experts=8, top_k=2, seed=tokens, empty_expert=3,
                                               dtype=dtype)
    x, weights, ids = x.cuda(), weights.cuda(), ids.cuda()
    gate_up, down = split_between_hbm_and_host(gate_up), split_between_hbm_and_host(down)
    stacks = [expert_stack(ws, x.device) for ws in (gate_up, down)]
    assert not any(isinstance(s, str) for s in stacks), stacks
    got = fused_moe(x, weights, ids, *stacks)
    want = reference_fused_moe(x, weights, ids, gate_up, down)
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    print(f"{fmt} {dtype} T={tokens}: worst relative error {err:.2e}")
    assert got.is_cuda and got.shape == (tokens, H) and err < TOLERANCE[dtype]


def test_fused_moe_captures_in_a_cuda_graph(compiled_triton):
    """Sort-and-align and both kernels read nothing back on the host: a graph replays them on new routing."""
    from gh200rt.kernels.triton.fused_moe import fused_moe
    from gh200rt.kernels.triton.fused_moe_operands import expert_stack
    x, weights, ids, gate_up, down = make_case("int8", 4, num_experts=8, top_k=2, seed=1)
    x, weights, ids = x.cuda(), weights.cuda(), ids.cuda()
    gate_up, down = split_between_hbm_and_host(gate_up), split_between_hbm_and_host(down)
    stacks = [expert_stack(ws, x.device) for ws in (gate_up, down)]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fused_moe(x, weights, ids, *stacks)            # warm-up: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, weights, ids, *stacks)
    new_ids = torch.flip(ids, dims=[0]).roll(1, dims=1) % 8
    ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fused_moe(x, weights, ids, *stacks))


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from tests.model.tiny_checkpoints import save_tiny
    path = str(tmp_path_factory.mktemp("tiny-moe-gpu"))
    save_tiny("qwen3-moe-norm", path)
    return path


def generate(model_dir: str, **options):
    config = EngineConfig.from_kwargs(model=model_dir, dtype="float32", max_model_len=128, num_kv_blocks=64,
                                      **options)
    engine = LLMEngine.from_config(config, poison=True)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    return engine, LLM.from_engine(engine).generate([[5, 9, 13, 17], [40, 41], list(range(60, 90))], params)


@pytest.mark.parametrize("label,options", [("direct experts", dict(moe_expert_tier="direct")),
                                           ("direct experts, int8", dict(moe_expert_tier="direct",
                                                                         host_weight_dtype="int8")),
                                           ("streamed experts (grouped path)", dict(moe_expert_tier="stream")),
                                           ("cpu-tier experts (grouped path)", dict(cpu_moe=True)),
                                           ("cpu-tier experts, int4, prefill on the GPU",
                                            dict(cpu_moe=True, host_weight_dtype="int4", moe_cpu_max_tokens=2))])
def test_engine_with_offloaded_experts_generates_what_all_resident_generates(compiled_triton, moe_dir, label,
                                                                             options):
    from gh200rt.models.moe import SparseMoeBlock
    _, reference = generate(moe_dir, offload="none", moe_expert_tier="resident")
    engine, outputs = generate(moe_dir, offload="none", **options)
    if "int" not in label:      # quantized experts change the numbers
        assert_same_or_near_tie(reference, outputs, label)
    assert all(len(o.outputs[0].token_ids) == 8 for o in outputs)
    blocks = [m for m in engine.runner.model.modules() if isinstance(m, SparseMoeBlock)]
    assert blocks and all(b.fused_experts_fn is not None for b in blocks)
    if "cpu" in label:            # computed by the host's pool; a prefill's many tokens on the GPU where asked
        runs = engine.stats().cpu_expert_tier["runs"]
        assert runs["cpu"] > 0 and (runs["device"] > 0) == ("prefill" in label), runs
    if "stream" in label or "cpu" in label:
        assert engine.graphs is None     # placed as the host learns the routing: decoded eagerly
    else:
        assert engine.graphs is not None and engine.stats().graph_captures > 0
    engine.close()
