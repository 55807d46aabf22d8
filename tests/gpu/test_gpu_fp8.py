"""fp8 on the GPU: the compiled store_kv writes the bytes torch's float8 conversion gives, the compiled
paged attention reads an fp8 pool as the reference does, and an FP8 checkpoint keeps fp8 weights in HBM
for its resident layers and generates what its dequantized twin generates."""
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.formats.pack import PackedWeight
from gh200rt.kernels.triton.paged_attention import paged_attention, reference_paged_attention
from gh200rt.kernels.triton.store_kv import reference_write_kv, write_kv
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import assert_same_or_near_tie, save_tiny_llama
from tests.kernels.test_kv_fp8 import EDGES, FP8, fp8_case, grid_and_ties
from tests.model.tiny_checkpoints import to_fp8_checkpoint

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_compiled_store_kv_rounds_like_torch(compiled_triton, dtype):
    x = grid_and_ties(dtype)
    rows = -(-len(x) // 64)
    x = torch.cat([x, torch.zeros(rows * 64 - len(x))]).view(rows, 1, 64).cuda()
    pool, want = (torch.zeros(2, rows, 1, 1, 64, dtype=dtype, device="cuda") for _ in range(2))
    scale = torch.tensor([1.0, 0.5], device="cuda")
    slots = torch.arange(rows, device="cuda")
    write_kv(pool, x, -x, slots, scale)
    reference_write_kv(want, x, -x, slots, scale)
    assert torch.equal(pool.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("block_size,query_lens,seq_lens", EDGES)
def test_compiled_paged_attention_reads_fp8(compiled_triton, kv_dtype, block_size, query_lens, seq_lens):
    q, pool, meta, scale = fp8_case(query_lens, seq_lens, 32, 8, 128, block_size, torch.bfloat16, kv_dtype, seed=1)
    want = reference_paged_attention(q, pool, meta, 128 ** -0.5, 8, scale)
    meta = type(meta).build(meta.query_lens_list, meta.seq_lens_list, meta.block_tables.tolist(), block_size, "cuda")
    got = paged_attention(q.cuda(), pool.cuda(), meta, 128 ** -0.5, 8, scale.cuda())
    err = (got.float().cpu() - want.float()).abs().max().item()
    print(f"compiled fp8 attention {kv_dtype} block={block_size}: worst error {err:.2e}")
    assert err < 2e-2


def layer0_bytes(engine) -> int:
    return sum(ref.current.nbytes for ref in engine.runner.model.layer_weight_refs(0).values())


def test_fp8_checkpoint_keeps_fp8_in_hbm(tmp_path):
    fp8_dir, dense_dir = str(tmp_path / "fp8"), str(tmp_path / "dense")
    save_tiny_llama(fp8_dir, num_layers=4)
    shutil.copytree(fp8_dir, dense_dir)
    dequantized = to_fp8_checkpoint(fp8_dir, "compressed-tensors")
    dense = load_file(os.path.join(dense_dir, "model.safetensors"))
    save_file({**dense, **dequantized}, os.path.join(dense_dir, "model.safetensors"), metadata={"format": "pt"})
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    prompts = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]
    outputs, layer0 = {}, {}
    for name, path, options in (("dense", dense_dir, dict(offload="none")), ("fp8", fp8_dir, dict(offload="none")),
                                ("fp8 mixed", fp8_dir, dict(offload="none", layer_tiers="1:streamed,3:direct"))):
        config = EngineConfig.from_kwargs(model=path, dtype="bfloat16", max_model_len=128, num_kv_blocks=64,
                                          **options)
        engine = LLMEngine.from_config(config)
        layer0[name] = layer0_bytes(engine)
        if name != "dense":                    # "dense" runs first: the bf16 twin every fp8 run is measured against
            ref = engine.runner.model.layer_weight_refs(0)["mlp.down_proj"]
            assert isinstance(ref.current, PackedWeight) and ref.current.fmt == "fp8" and ref.current.device.type == "cuda"
            # one byte a weight and a float32 scale a row (K = 64 or 128): about half of bf16
            assert layer0[name] < 0.55 * layer0["dense"]
        outputs[name] = LLM.from_engine(engine).generate(prompts, params)
        engine.close()
    # bf16 activations either way; the dense twin multiplies the same weight values (tie gap: bf16 rounding)
    assert_same_or_near_tie(outputs["dense"], outputs["fp8"], "fp8 resident", tie_gap=0.05)
    assert_same_or_near_tie(outputs["dense"], outputs["fp8 mixed"], "fp8 mixed tiers", tie_gap=0.05)
