"""Split-K paged attention compiled on CUDA at long contexts with Llama-3-8B's heads (32 query, 8 KV, D 128,
blocks of 16): the chosen and forced splits against the reference and the single pass, an fp8 pool, and a
decode step captured in a CUDA graph, replayed with new lengths and block tables."""
import dataclasses

import pytest
import torch

from gh200rt.kernels.triton.paged_attention import attention_splits, paged_attention, reference_paged_attention
from gh200rt.models.base import AttentionMetadata

pytestmark = pytest.mark.gpu
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
SCALE = HEAD_DIM ** -0.5
TOLERANCE = 2e-2  # bf16 output against the float32 reference
# Split against single pass: the walk's dots run in tf32, and each split rounds its probabilities against its
# own running maximum, so the two differ by tf32's 2^-11 of each term, not by float32 reordering alone. On an
# H100 the worst element differed by 2.9e-5 (docs/gpu-runs/h100-2026-11-26b); bf16's default atol of 1e-5 is
# below that where outputs cross zero.
SPLIT_ATOL = 1e-4


def scattered_tables(seq_lens: list[int], seed: int) -> tuple[list[list[int]], int]:
    """Block tables over a shuffled pool (block 0 left as padding) and the pool's block count."""
    needed = [-(-s // BLOCK) for s in seq_lens]
    ids = (torch.randperm(sum(needed), generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    starts = [sum(needed[:b]) for b in range(len(needed))]
    return [ids[at:at + n] for at, n in zip(starts, needed)], sum(needed) + 1


def random_pool(num_blocks: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pool = torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen, device="cuda")
    return pool.to(dtype) if dtype.itemsize > 1 else (pool * 40).to(dtype)  # fp8: codes across the grid


def decode_case(batch: int, context: int, kv_dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    seq_lens = [context - 37 * b for b in range(batch)]  # different lengths, ends off the block boundary
    tables, num_blocks = scattered_tables(seq_lens, seed)
    meta = AttentionMetadata.build([1] * batch, seq_lens, tables, BLOCK, "cuda")
    q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))
    return q.to(torch.bfloat16), random_pool(num_blocks, kv_dtype, seed + 1), meta


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("context", [4096, 16384])
def test_compiled_splits_match_reference_and_the_single_pass(compiled_triton, batch, context):
    q, pool, meta = decode_case(batch, context)
    chosen = attention_splits(batch, KV_HEADS, meta.block_tables.shape[1], BLOCK)
    assert chosen > 1, "a decode this small should split"
    want = reference_paged_attention(q, pool, meta, SCALE, KV_HEADS)
    single = paged_attention(q, pool, meta, SCALE, KV_HEADS, num_splits=1)
    auto = paged_attention(q, pool, meta, SCALE, KV_HEADS)
    uneven = paged_attention(q, pool, meta, SCALE, KV_HEADS, num_splits=7)
    errors = {name: (got.float() - want.float()).abs().max().item()
              for name, got in (("single", single), (f"auto={chosen}", auto), ("7 splits", uneven))}
    print(f"batch {batch} context {context}: worst error against the reference {errors}")
    assert max(errors.values()) < TOLERANCE
    torch.testing.assert_close(auto, single, atol=SPLIT_ATOL, rtol=1.6e-2)
    torch.testing.assert_close(uneven, single, atol=SPLIT_ATOL, rtol=1.6e-2)


@pytest.mark.parametrize("batch", [1, 8])
def test_compiled_splits_read_an_fp8_pool(compiled_triton, batch):
    q, pool, meta = decode_case(batch, 4096, torch.float8_e4m3fn, seed=3)
    kv_scale = torch.tensor([0.02, 0.03], device="cuda")
    want = reference_paged_attention(q, pool, meta, SCALE, KV_HEADS, kv_scale)
    single = paged_attention(q, pool, meta, SCALE, KV_HEADS, kv_scale, num_splits=1)
    split = paged_attention(q, pool, meta, SCALE, KV_HEADS, kv_scale, num_splits=16)
    err = (split.float() - want.float()).abs().max().item()
    print(f"fp8 pool batch {batch}: 16 splits worst error {err:.2e}")
    assert err < TOLERANCE
    torch.testing.assert_close(split, single, atol=SPLIT_ATOL, rtol=1.6e-2)


def test_split_decode_replays_in_a_cuda_graph_with_new_lengths_and_tables(compiled_triton):
    """Persistent buffers as engine/decode_graphs/decode_buffers.py holds them: the host lists fixed at the
    capacity, the device tensors refilled before each replay."""
    batch, capacity = 2, 8192
    width = capacity // BLOCK
    assert attention_splits(batch, KV_HEADS, width, BLOCK) > 1
    num_blocks = batch * width + 1
    pool = random_pool(num_blocks, torch.bfloat16, seed=7)
    q = torch.zeros(batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    meta = AttentionMetadata(
        query_start_loc=torch.arange(batch + 1, device="cuda"),
        seq_lens=torch.ones(batch, dtype=torch.int64, device="cuda"),
        block_tables=torch.zeros(batch, width, dtype=torch.int32, device="cuda"),
        slot_mapping=torch.full((batch,), -1, dtype=torch.int64, device="cuda"),
        query_lens_list=[1] * batch, seq_lens_list=[capacity] * batch, block_size=BLOCK)

    def refill(seq_lens: list[int], seed: int) -> AttentionMetadata:
        tables, _ = scattered_tables(seq_lens, seed)
        meta.seq_lens.copy_(torch.tensor(seq_lens))
        meta.block_tables.zero_()
        for b, table in enumerate(tables):
            meta.block_tables[b, :len(table)] = torch.tensor(table, dtype=torch.int32)
        q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)))
        return AttentionMetadata.build([1] * batch, seq_lens, tables, BLOCK, "cuda")

    refill([3000, 900], seed=1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiles the kernels outside the capture, on a copy whose layout is not kept
        paged_attention(q, pool, dataclasses.replace(meta), SCALE, KV_HEADS)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention(q, pool, meta, SCALE, KV_HEADS)
    for seed, seq_lens in enumerate(([5000, 37], [capacity, 1200], [17, 4096]), start=2):
        eager_meta = refill(seq_lens, seed)
        graph.replay()
        want = reference_paged_attention(q, pool, eager_meta, SCALE, KV_HEADS)
        err = (out.float() - want.float()).abs().max().item()
        print(f"replay with lengths {seq_lens}: worst error {err:.2e}")
        assert err < TOLERANCE
