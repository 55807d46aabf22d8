"""Split-K (flash-decoding) paged attention, interpreted here: forced split counts against the reference (empty
shares included), fp8 pools, the padded block tables a CUDA graph sees, and the split-count heuristic."""
import dataclasses

import pytest
import torch

from gh200rt.kernels.triton import paged_attention as attention_module
from gh200rt.kernels.triton import paged_attention_split as split_module
from gh200rt.kernels.triton.paged_attention import attention_splits, paged_attention, reference_paged_attention
from tests.kernels.test_kv_fp8 import FP8, fp8_case
from tests.kernels.test_paged_attention import build_case

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
# decodes at 2 and 10 keys and a prefix-cached chunk of 3 new tokens over 11: 1, 3 and 3 blocks of 4
QUERY_LENS, SEQ_LENS = [1, 1, 3], [2, 10, 11]


def padded(meta, width: int):
    """``meta`` with block tables as wide as a graph's persistent buffer: zeros past each row's blocks."""
    extra = width - meta.block_tables.shape[1]
    return dataclasses.replace(meta, block_tables=torch.nn.functional.pad(meta.block_tables, (0, extra)))


def worst_error(got, q, pool, meta, kv_heads, kv_scale=None) -> float:
    want = reference_paged_attention(q, pool, meta, q.shape[2] ** -0.5, kv_heads, kv_scale)
    assert got.isfinite().all(), "a split with no keys leaked a NaN or inf"
    return (got.float() - want.float()).abs().max().item()


class LaunchSpy:
    """Stands in for a kernel in its module: records each launch's grid and launches it."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch):
    spies = {}
    for module, name in ((attention_module, "paged_attention_kernel"), (split_module, "paged_attention_split_kernel"),
                         (split_module, "paged_attention_combine_kernel")):
        spies[name.removeprefix("paged_attention_").removesuffix("_kernel")] = spy = LaunchSpy(getattr(module, name))
        monkeypatch.setattr(module, name, spy)
    return spies


@pytest.mark.interpreter
@pytest.mark.parametrize("num_splits", [1, 2, 3, 8])  # 8: more splits than any token has blocks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("heads,kv_heads,d,block_size", [(6, 2, 32, 4), (4, 4, 24, 1)])
def test_forced_splits_match_reference(num_splits, dtype, heads, kv_heads, d, block_size):
    q, pool, meta = build_case(QUERY_LENS, SEQ_LENS, heads, kv_heads, d, block_size, dtype, seed=num_splits + d)
    meta = padded(meta, meta.block_tables.shape[1] + 5)
    got = paged_attention(q, pool, meta, d ** -0.5, kv_heads, num_splits=num_splits)
    err = worst_error(got, q, pool, meta, kv_heads)
    print(f"{num_splits} splits {dtype} heads={heads}/{kv_heads} D={d} block={block_size}: worst error {err:.2e}")
    assert err < TOLERANCE[dtype]


# at blocks of 16 (4-block tiles) 300 keys are 19 blocks: 2 splits cut shares of 10 and 9, 5 splits four of 4 (a
# tile each) and one of 3, each ending inside its last tile; 130 keys (9 blocks) in 2 shares of 5 and 4; 65 keys in 5
# splits: a tile, then a block
TILE_SPLIT_QUERY_LENS, TILE_SPLIT_SEQ_LENS = [1, 1, 1, 3, 1], [1, 17, 65, 130, 300]


@pytest.mark.interpreter
@pytest.mark.parametrize("num_splits", [2, 5])   # 3 splits: test_forced_splits_match_reference
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("group", [1, 8])
@pytest.mark.parametrize("block_size", [16, 32])
def test_split_shares_that_end_inside_a_tile(num_splits, dtype, group, block_size):
    q, pool, meta = build_case(TILE_SPLIT_QUERY_LENS, TILE_SPLIT_SEQ_LENS, group * 2, 2, 64, block_size, dtype,
                               seed=num_splits + group + block_size)
    got = paged_attention(q, pool, meta, 64 ** -0.5, 2, num_splits=num_splits)
    err = worst_error(got, q, pool, meta, 2)
    print(f"{num_splits} splits {dtype} group={group} block={block_size}: worst error {err:.2e}")
    assert err < TOLERANCE[dtype]


# (query lens, sequence lens, query heads, head dim, block size): short blocks, and shares ending inside a tile
FP8_LAYOUTS = {"blocks of 4": (QUERY_LENS, SEQ_LENS, 6, 32, 4),
               "tile edges": (TILE_SPLIT_QUERY_LENS, TILE_SPLIT_SEQ_LENS, 8, 64, 16)}


@pytest.mark.interpreter
@pytest.mark.parametrize("layout", sorted(FP8_LAYOUTS))
@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("num_splits", [2, 3])
def test_forced_splits_read_fp8_pools_with_each_scale_once(layout, kv_dtype, num_splits):
    query_lens, seq_lens, heads, d, block_size = FP8_LAYOUTS[layout]
    q, pool, meta, scale = fp8_case(query_lens, seq_lens, heads, 2, d, block_size, torch.float32, kv_dtype,
                                    seed=num_splits)
    got = paged_attention(q, pool, meta, d ** -0.5, 2, scale, num_splits=num_splits)
    err = worst_error(got, q, pool, meta, 2, scale)
    print(f"{num_splits} splits over {kv_dtype}, {layout}: worst error {err:.2e}")
    assert err < 1e-5


@pytest.mark.interpreter
def test_auto_splits_a_short_batch_over_a_wide_table(launches):
    """A graph's table is as wide as the longest sequence allowed; the splits follow it, the shares each
    token's own length."""
    q, pool, meta = build_case([1, 1], [7, 13], 6, 2, 32, 4, torch.float32, seed=4)
    meta = padded(meta, 256)  # 1024 keys of table at block 4: room for 4 shares of MIN_PARTITION_TOKENS
    got = paged_attention(q, pool, meta, 32 ** -0.5, 2)
    assert launches["split"].grids == [(2, 2, 4)] and launches["combine"].grids == [(2, 6)]
    assert launches["kernel"].grids == []
    assert worst_error(got, q, pool, meta, 2) < 1e-5


@pytest.mark.interpreter
def test_one_split_launches_the_single_pass_kernel_alone(launches):
    q, pool, meta = build_case([1, 1], [7, 13], 6, 2, 32, 4, torch.float32, seed=5)
    got = paged_attention(q, pool, meta, 32 ** -0.5, 2)
    assert launches["kernel"].grids == [(2, 2)]
    assert launches["split"].grids == [] and launches["combine"].grids == []
    assert worst_error(got, q, pool, meta, 2) < 1e-5


def test_split_count_fills_the_gpu_only_where_programs_are_few():
    # Llama-3-8B decode (8 KV heads, blocks of 16) under a table of 8192 keys
    assert attention_splits(1, 8, 512, 16) == 32    # 528 // 8 = 66, capped at 8192 / 256-key shares
    assert attention_splits(8, 8, 512, 16) == 8     # 64 programs x 8
    assert attention_splits(32, 8, 512, 16) == 2
    assert attention_splits(64, 8, 512, 16) == 1    # 512 programs: one pass, no combine
    assert attention_splits(1, 8, 8192, 16) == 66   # a 131072-key table: the program target binds
    assert attention_splits(1, 8, 16, 16) == 1      # 256 keys at most: nothing worth splitting
    assert attention_splits(1, 8, 512, 16, target_programs=132) == 16
    assert attention_splits(1, 8, 4, 512) == 4      # 512-key blocks: a walk tile each, so one split a block at most


def test_split_count_must_be_positive():
    q = torch.zeros(1, 2, 8)
    pool = torch.zeros(2, 2, 4, 1, 8)
    from gh200rt.models.base import AttentionMetadata
    meta = AttentionMetadata.build([1], [3], [[1]], 4)
    with pytest.raises(ValueError, match="num_splits must be 1 or more"):
        paged_attention(q, pool, meta, 1.0, 1, num_splits=0)
