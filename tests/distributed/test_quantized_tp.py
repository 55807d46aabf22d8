"""Tensor-parallel shards of quantized checkpoints on the CPU over gloo: a tiny Llama as a GGUF file (F32 and Q8_0)
and as an FP8 checkpoint (per-tensor attention scales, per-channel MLP scales) gives TP=1's greedy tokens with two
ranks in float32; each rank's GGUF blocks are its half of the rows (q/k/v, gate/up, vocabulary) or of the columns
(o, down) of TP=1's blocks, and a column slice that splits a block is refused naming the tensor, before any
worker starts."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from gh200rt.config import ModelConfig
from gh200rt.distributed.launch import usable_cores
from gh200rt.distributed.sharding import TensorShard
from gh200rt.loader import ModelLoadError, load_model
from gh200rt.loader.load import read_arch
from gh200rt.sampling_params import SamplingParams
from tests.distributed.rank_children import rank_processes_of
from tests.distributed.tiny_tp_models import save_tp_tiny, tp_llm
from tests.engine.real_models import assert_same_or_near_tie
from tests.model.tiny_checkpoints import to_fp8_checkpoint
from tests.model.tiny_gguf import write_gguf

pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="two ranks need two CPU cores")

PROMPTS = [[5, 9, 33, 71, 100, 4], [200, 3, 17]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=2)
# hidden 64 (o's K: 32 per rank), intermediate 128 (down's K: 64 per rank): whole Q8_0 blocks of 32 on two ranks
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_tp_tiny("llama-gqa", str(tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="module")
def gguf_files(llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    files = {}
    for qtype in ("F32", "Q8_0"):
        files[qtype] = str(root / f"llama-{qtype}.gguf")
        write_gguf(llama, files[qtype], qtype)
    return files


def assert_tp2_equals_tp1(path: str, what: str) -> None:
    single = tp_llm(path, 1)
    reference = single.generate(PROMPTS, GREEDY)
    single.engine.close()
    llm = tp_llm(path, 2)
    try:
        outputs = llm.generate(PROMPTS, GREEDY)
    finally:
        llm.engine.close()
    differing = assert_same_or_near_tie(reference, outputs, f"{what} TP=2")
    print(f"{what}: {differing} near-tie divergences")


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_gguf_tp2_greedy_equals_tp1(gguf_files, qtype):
    assert_tp2_equals_tp1(gguf_files[qtype], f"GGUF {qtype}")


def test_each_rank_holds_its_half_of_the_gguf_blocks(gguf_files):
    path = gguf_files["Q8_0"]
    config = ModelConfig(model=path, dtype="float32")
    whole = load_model(config).quantized
    arch = read_arch(path)
    ranks = [load_model(config, shard=TensorShard(r, 2, arch)).quantized for r in range(2)]
    assert whole and all(set(q) == set(whole) for q in ranks)
    for name, full in whole.items():
        dim = 1 if any(f".{p}." in name for p in ROW_PARALLEL) else 0
        halves = [q[name] for q in ranks]
        for half in halves:
            want = list(full.shape)
            want[dim] //= 2
            assert list(half.shape) == want, (name, half.shape, full.shape)
            assert half.data.shape[dim] * 2 == full.data.shape[dim], name
        # the ranks' blocks, side by side, are TP=1's (q/k un-permuted the same way), byte for byte
        assert np.array_equal(np.concatenate([h.data for h in halves], axis=dim), full.data), name


def test_a_column_slice_that_splits_a_block_is_refused(gguf_files):
    path = gguf_files["Q8_0"]
    shard = TensorShard(0, 4, read_arch(path))       # o's K 64 / 4 = 16: half a Q8_0 block
    refusal = r"blk\.0\.attn_output\.weight is Q8_0, whose blocks hold 32 values.*--tensor-parallel-size 4.*" \
              r"64/4 must be a multiple of 32"
    with pytest.raises(ModelLoadError, match=refusal):
        load_model(ModelConfig(model=path, dtype="float32"), shard=shard)
    with pytest.raises(ModelLoadError, match=refusal):     # the engine refuses it before it starts any worker
        tp_llm(path, 4)
    assert not rank_processes_of()
    load_model(ModelConfig(model=gguf_files["F32"], dtype="float32"), shard=shard)   # F32: no blocks to split


def test_fp8_checkpoint_tp2_greedy_equals_tp1(llama, tmp_path):
    path = str(tmp_path / "fp8")
    shutil.copytree(llama, path)
    to_fp8_checkpoint(path, "fp8")
    arch = read_arch(path)
    config = ModelConfig(model=path, dtype="float32")
    whole = load_model(config).quantized
    assert whole
    for rank in range(2):      # each rank's fp8 bytes and scales are its rows (with their scales) or columns of TP=1's
        part = load_model(config, shard=TensorShard(rank, 2, arch)).quantized
        assert set(part) == set(whole)
        for name, full in whole.items():
            dim = 1 if any(f".{p}." in name for p in ROW_PARALLEL) else 0
            size = full.qweight.shape[dim] // 2
            want = full.qweight.narrow(dim, rank * size, size)
            assert torch.equal(part[name].qweight.view(torch.uint8), want.view(torch.uint8)), name
            scale = full.scale if dim == 1 else full.scale.narrow(0, rank * size, size)
            assert torch.equal(part[name].scale, scale), name
    assert_tp2_equals_tp1(path, "FP8")
