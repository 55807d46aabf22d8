"""Paged attention reading some blocks from the host KV tier in place: a table entry from ``first_id`` on names a
host block. The same step with those blocks moved to the host gives the bits it gives with them on the device: the
Triton kernels (interpreted here) single-pass and split, over bf16, fp32 and fp8 pools, through the padded tables a
CUDA graph sees, the torch attention's gather and the native CPU kernels (decodes and prompt chunks in one step).
The device blocks they left are poisoned, so a read of the wrong pool shows."""
import dataclasses
import platform

import pytest
import torch

from gh200rt.backends.cpu.native import load_native_ops, native_ops_error
from gh200rt.kernels.triton.paged_attention import paged_attention, reference_paged_attention
from gh200rt.kv import attention as torch_attention
from gh200rt.kv.host_blocks import HostBlocksView
from tests.kernels.native_builds import native_ops_for
from tests.kernels.test_kv_fp8 import FP8, fp8_case
from tests.kernels.test_paged_attention import build_case
from tests.kernels.paged_cases import scattered_case
from tests.kernels.test_split_attention import padded

LAYERS, LAYER = 3, 1      # the tier holds every layer's share of a block; the case is layer 1's
# decodes at 2, 17 and 40 keys and a 3-token chunk over 37: blocks of 4, contexts ending inside a walk tile
QUERY_LENS, SEQ_LENS = [1, 1, 1, 3], [2, 17, 40, 37]


def move_to_host(pool: torch.Tensor, meta, which, spare_slots: int = 2):
    """(meta with the chosen table entries pointing at host blocks, the layer's ``HostBlocksView``): every entry
    ``which(row, column)`` picks is copied into a host tier laid out as the real one (``[slots, layers, 2,
    block_size, kv_heads, head_dim]``, block-major), in shuffled slots, and its device block is poisoned."""
    tables = meta.block_tables.clone()
    entries = [(r, c) for r in range(tables.shape[0]) for c in range(-(-meta.seq_lens_list[r] // meta.block_size))
               if which(r, c)]
    assert entries, "the case moves no block"
    slots = torch.randperm(len(entries) + spare_slots, generator=torch.Generator().manual_seed(7)).tolist()
    tier = torch.zeros(len(slots), LAYERS, *pool.shape[:1], *pool.shape[2:], dtype=pool.dtype)
    tier.view(torch.uint8).fill_(0x7f)     # whatever is not copied in reads as a huge or NaN value
    view = HostBlocksView(tier[:, LAYER].transpose(0, 1), first_id=pool.shape[1] + 5)
    poisoned = pool.clone()
    for (row, col), slot in zip(entries, slots):
        block = int(tables[row, col])
        view.pool[:, slot] = pool[:, block]
        tables[row, col] = view.first_id + slot
    for row, col in entries:
        poisoned[:, int(meta.block_tables[row, col])].view(torch.uint8).fill_(0x7f)
    return dataclasses.replace(meta, block_tables=tables), view, poisoned


MOVES = {
    "prefixes": lambda row, col: col < 2,          # a prompt's leading blocks, as a host-tier hit leaves them
    "every other": lambda row, col: col % 2 == 0,  # host and device blocks interleaved within a tile
    "all": lambda row, col: True,
}


@pytest.mark.interpreter
@pytest.mark.parametrize("moved,dtype,num_splits", [("prefixes", torch.bfloat16, 1), ("every other", torch.float32, 1),
                                                    ("all", torch.bfloat16, 1), ("every other", torch.bfloat16, 3),
                                                    ("prefixes", torch.float32, 2)], ids=str)
def test_host_blocks_give_the_device_blocks_bits(moved, dtype, num_splits):
    q, pool, meta = build_case(QUERY_LENS, SEQ_LENS, 6, 2, 32, 4, dtype, seed=num_splits)
    meta = padded(meta, meta.block_tables.shape[1] + 3)
    want = paged_attention(q, pool, meta, 32 ** -0.5, 2, num_splits=num_splits)
    host_meta, host, poisoned = move_to_host(pool, meta, MOVES[moved])
    got = paged_attention(q, poisoned, host_meta, 32 ** -0.5, 2, num_splits=num_splits, host=host)
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    reference = reference_paged_attention(q, poisoned, host_meta, 32 ** -0.5, 2, host=host)
    assert (reference.float() - want.float()).abs().max() < {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]


@pytest.mark.interpreter
@pytest.mark.parametrize("kv_dtype,num_splits", list(zip(FP8, [1, 2])), ids=str)
def test_host_blocks_of_an_fp8_pool_are_read_with_its_scales(kv_dtype, num_splits):
    q, pool, meta, scale = fp8_case(QUERY_LENS, SEQ_LENS, 6, 2, 32, 4, torch.float32, kv_dtype, seed=num_splits)
    want = paged_attention(q, pool, meta, 32 ** -0.5, 2, scale, num_splits=num_splits)
    host_meta, host, poisoned = move_to_host(pool, meta, MOVES["every other"])
    got = paged_attention(q, poisoned, host_meta, 32 ** -0.5, 2, scale, num_splits=num_splits, host=host)
    assert torch.equal(got, want)


@pytest.mark.interpreter
@pytest.mark.parametrize("num_splits", [1, 3])
def test_the_latent_kernel_reads_host_blocks_as_device_ones(num_splits):
    """Latent attention's one-plane pool (DeepSeek-V3's): host rows read in place, the device rows' bits."""
    from gh200rt.kernels.triton.mla_attention import mla_attention
    q, pool, meta, _ = scattered_case([1, 1, 4], [3, 45, 33], 20, 1, 48, 8, torch.bfloat16, seed=num_splits)
    plane = pool[:1]
    want = mla_attention(q, plane[0], meta, 0.15, num_splits=num_splits)
    host_meta, host, poisoned = move_to_host(plane, meta, MOVES["every other"])
    got = mla_attention(q, poisoned[0], host_meta, 0.15, num_splits=num_splits, host=host)
    assert torch.equal(got, want)


@pytest.mark.interpreter
def test_a_host_pool_laid_out_unlike_the_device_pool_is_refused():
    q, pool, meta = build_case([1], [9], 4, 2, 16, 4, torch.float32, seed=1)
    host_meta, host, poisoned = move_to_host(pool, meta, MOVES["prefixes"])
    wrong = HostBlocksView(host.pool.transpose(3, 4), host.first_id)   # heads and head dim swapped
    with pytest.raises(AssertionError, match="laid out as a device block"):
        paged_attention(q, poisoned, host_meta, 0.25, 2, host=wrong)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, *FP8], ids=str)
@pytest.mark.parametrize("moved", sorted(MOVES))
def test_the_torch_attention_gathers_host_blocks_as_device_ones(kv_dtype, moved):
    if kv_dtype in FP8:
        q, pool, meta, scale = fp8_case(QUERY_LENS, SEQ_LENS, 6, 2, 32, 4, torch.float32, kv_dtype, seed=3)
    else:
        q, pool, meta = build_case(QUERY_LENS, SEQ_LENS, 6, 2, 32, 4, kv_dtype, seed=3)
        scale = None
    want = torch_attention.paged_attention(q, pool, meta, 32 ** -0.5, 2, scale)
    host_meta, host, poisoned = move_to_host(pool, meta, MOVES[moved])
    got = torch_attention.paged_attention(q, poisoned, host_meta, 32 ** -0.5, 2, scale, host=host)
    assert torch.equal(got, want)


NATIVE = load_native_ops()
needs_native = pytest.mark.skipif(NATIVE is None, reason=f"native CPU ops unavailable: {native_ops_error()}")


@pytest.fixture(scope="module")
def native_builds(tmp_path_factory):
    """The native ops this host runs: the vector build it loads, and on x86-64 the baseline (portable C) build."""
    builds = {"vector": NATIVE}
    if platform.machine() in ("x86_64", "AMD64"):
        builds["portable"] = native_ops_for("x86-64", tmp_path_factory.mktemp("portable"))
    return builds


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, FP8[0]], ids=str)
@pytest.mark.parametrize("head_dim", [32, 24], ids=["vector-path", "keywise-path"])
@pytest.mark.parametrize("moved", sorted(MOVES))
def test_the_native_kernels_read_host_blocks_as_device_ones(native_builds, kv_dtype, head_dim, moved):
    """Decodes (the tiled and the key-by-key paths) and a prompt chunk through the native kernels, in one step as
    the engine's hook runs them, on every build this host runs."""
    if kv_dtype in FP8:
        q, pool, meta, scale = fp8_case(QUERY_LENS, SEQ_LENS, 6, 2, head_dim, 4, torch.float32, kv_dtype, seed=5)
    else:
        q, pool, meta = build_case(QUERY_LENS, SEQ_LENS, 6, 2, head_dim, 4, kv_dtype, seed=5)
        scale = None
    host_meta, host, poisoned = move_to_host(pool, meta, MOVES[moved])
    for name, ops in native_builds.items():
        def run(pool_, meta_, host_=None):
            return torch_attention.paged_attention(q, pool_, meta_, head_dim ** -0.5, 2, scale,
                                                   decode_kernel=ops.decode_attention,
                                                   extend_kernel=ops.extend_attention, host=host_)
        want = run(pool, meta)
        assert torch.equal(run(poisoned, host_meta, host), want), name


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_one_call_decode_block_reads_host_blocks_and_writes_the_pool(dtype):
    """``decode_attention_block`` (RoPE, the KV store, attention) over tables naming host blocks: the new K and V
    go to the device slots, attention reads the host blocks in place, and the output is the device case's."""
    heads, kv_heads, d, seqs = 4, 2, 32, [9, 23, 16]
    _, pool, meta = build_case([1] * len(seqs), seqs, heads, kv_heads, d, 4, dtype, seed=2)
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(len(seqs), (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    cos, sin = (torch.randn(len(seqs), 1, d // 2, generator=gen).to(dtype) for _ in range(2))
    # every block but each sequence's last (where its new token's slot is) moves to the host
    last = [(n - 1) // meta.block_size for n in seqs]
    host_meta, host, poisoned = move_to_host(pool, meta, lambda row, col: col < last[row])
    device = pool.clone()
    want = NATIVE.decode_attention_block(qkv, cos, sin, device, meta.slot_mapping, meta.block_tables, meta.seq_lens,
                                         d ** -0.5, heads, kv_heads)
    got = NATIVE.decode_attention_block(qkv, cos, sin, poisoned, host_meta.slot_mapping, host_meta.block_tables,
                                        host_meta.seq_lens, d ** -0.5, heads, kv_heads, host=host)
    assert torch.equal(got, want)
    slots = meta.slot_mapping.long()
    stored = lambda p: p.flatten(1, 2).index_select(1, slots)      # noqa: E731  (the new tokens' rows)
    assert torch.equal(stored(poisoned), stored(device))


@needs_native
def test_a_host_view_laid_out_unlike_the_pool_is_refused_by_the_native_kernels():
    q, pool, meta = build_case([1], [9], 4, 2, 16, 4, torch.float32, seed=1)
    host_meta, host, poisoned = move_to_host(pool, meta, MOVES["prefixes"])
    wrong = HostBlocksView(host.pool.transpose(3, 4), host.first_id)   # heads and head dim swapped
    with pytest.raises(AssertionError, match="laid out as the pool's"):
        NATIVE.decode_attention(q, poisoned, host_meta.block_tables, host_meta.seq_lens, 0.25, host=wrong)
