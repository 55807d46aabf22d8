"""Dense weight -> ``PackedWeight``: the int8 / int4 / fp8 quantizers, an FP8 checkpoint's weight taken as it is,
quantizing in row blocks on several threads, and the layout of a quantized weight without quantizing.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch

from gh200rt.formats.packed_layout import FP8_MAX, INT4_DEFAULT_GROUP, pack_int4
from gh200rt.formats.packed_weight import PackedWeight


def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    n, k = w.shape
    groups = -(-k // group_size)
    pad = groups * group_size - k
    if pad:  # padding repeats the last column so it never widens a group's range
        w = torch.cat([w, w[:, -1:].expand(n, pad)], dim=1)
    return w.reshape(n, groups, group_size)


def quantize_int8(w: torch.Tensor, group_size: int | None = None, cpu_route: str = "exact") -> PackedWeight:
    """Symmetric int8, one scale per output channel (or per group of ``group_size`` columns)."""
    w = w.detach().to(torch.float32)
    n, k = w.shape
    group_size = group_size or k
    g = _grouped(w, group_size)
    scale = g.abs().amax(dim=-1).clamp(min=1e-12) / 127.0
    q = torch.round(g / scale[..., None]).clamp(-127, 127).reshape(n, -1)[:, :k].to(torch.int8)
    return PackedWeight("int8", q.contiguous(), scale.contiguous(), None, group_size, (n, k), cpu_route)


def quantize_int4(w: torch.Tensor, group_size: int = INT4_DEFAULT_GROUP) -> PackedWeight:
    """Asymmetric int4 per group: ``minimum`` is the group's minimum, ``scale`` its range / 15."""
    w = w.detach().to(torch.float32)
    n, k = w.shape
    g = _grouped(w, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).reshape(n, -1)[:, :k]
    return PackedWeight("int4", pack_int4(q), scale.contiguous(), lo.contiguous(), group_size, (n, k))


def quantize_fp8(w: torch.Tensor) -> PackedWeight:
    """float8_e4m3fn with one float32 scale per output channel (the row's largest magnitude maps to 448)."""
    w = w.detach().to(torch.float32)
    n, k = w.shape
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return PackedWeight("fp8", q.contiguous(), scale.contiguous(), None, k, (n, k))


def fp8_from_checkpoint(weight: torch.Tensor, weight_scale: torch.Tensor) -> PackedWeight:
    """An FP8 checkpoint's ``weight`` (float8_e4m3fn ``[N, K]``) and ``weight_scale`` (one value, or one per
    output channel: ``[1]``, ``[]``, ``[N]`` or ``[N, 1]``) as a packed fp8 weight, without loss."""
    n, k = weight.shape
    scale = weight_scale.detach().to(torch.float32).reshape(-1)
    if weight.dtype != torch.float8_e4m3fn or scale.numel() not in (1, n):
        raise ValueError(f"an fp8 weight is float8_e4m3fn [N, K] with one scale or one per output channel; got "
                         f"{weight.dtype} {tuple(weight.shape)} with weight_scale {tuple(weight_scale.shape)}")
    scale = scale.expand(n).reshape(n, 1).contiguous()
    return PackedWeight("fp8", weight.contiguous(), scale, None, k, (n, k))


def fp8_blocks_from_checkpoint(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> PackedWeight:
    """A block-FP8 checkpoint's ``weight`` (float8_e4m3fn ``[N, K]``) and ``weight_scale_inv`` (float32, one per block
    of ``block`` = (rows, columns): ``[ceil(N / rows), ceil(K / columns)]``) as a packed fp8 weight with groups of
    ``columns`` along K, each row carrying its block row's scales, without loss (DeepSeek-V3's layout)."""
    n, k = weight.shape
    rows, cols = block
    want = (-(-n // rows), -(-k // cols))
    if weight.dtype != torch.float8_e4m3fn or tuple(scale_inv.shape) != want:
        raise ValueError(f"a block-fp8 weight [{n}, {k}] in blocks of {rows}x{cols} has float8_e4m3fn codes and "
                         f"weight_scale_inv of shape {want}; got {weight.dtype} and {tuple(scale_inv.shape)}")
    scale = scale_inv.detach().to(torch.float32).repeat_interleave(rows, dim=0)[:n].contiguous()
    return PackedWeight("fp8", weight.contiguous(), scale, None, cols, (n, k))


QUANT_BLOCK_ROWS = 256   # output rows per block of quantize_rows: a block's float32 temporaries stay in cache
# int4-g128: int4 with a scale and minimum per 128 columns (4.5 bits a weight against int4's 6)
INT4_FORMAT_GROUPS = {"int4": INT4_DEFAULT_GROUP, "int4-g128": 128}
_QUANTIZERS = {"int8": quantize_int8, "int4": quantize_int4, "fp8": quantize_fp8,
               "int4-g128": lambda w: quantize_int4(w, INT4_FORMAT_GROUPS["int4-g128"])}


def empty_packed(fmt: str, shape: tuple[int, int], device: torch.device | str = "meta") -> PackedWeight:
    """The ``PackedWeight`` that ``quantize_rows(w, fmt)`` makes of a ``shape`` weight, with uninitialised (by default
    storage-free) tensors: its layout, without quantizing anything."""
    n, k = shape
    group = INT4_FORMAT_GROUPS.get(fmt, k)
    groups = -(-k // group)
    scale = torch.empty(n, groups, dtype=torch.float32, device=device)
    if fmt in INT4_FORMAT_GROUPS:
        return PackedWeight("int4", torch.empty(n, (k + 1) // 2, dtype=torch.uint8, device=device), scale,
                            torch.empty(n, groups, dtype=torch.float32, device=device), group, (n, k))
    codes = torch.int8 if fmt == "int8" else torch.float8_e4m3fn
    return PackedWeight(fmt, torch.empty(n, k, dtype=codes, device=device), scale, None, group, (n, k))


def quantize_rows(w: torch.Tensor, fmt: str, workers: int = 1, rows: int = QUANT_BLOCK_ROWS,
                  dtype: torch.dtype | None = None) -> PackedWeight:
    """``int8`` / ``int4`` / ``fp8`` of a dense ``[N, K]`` weight, quantized in blocks of ``rows`` output rows on
    ``workers`` threads (``quantize_stacked`` of the one weight). Every row (and its groups) is quantized on its
    own, so the result is bit-identical to one call over the whole weight. ``dtype``: each block is first rounded
    to it (a checkpoint's tensor quantized as the model's dense copy of it would be)."""
    if workers <= 1 or w.shape[0] <= rows:     # one thread: one call (blocks alone measured no faster)
        return _QUANTIZERS[fmt](w if dtype is None else w.to(dtype))
    return quantize_stacked({"w": [w]}, fmt, workers, rows, dtype)["w"]


def quantize_stacked(groups: dict[str, list[torch.Tensor]], fmt: str, workers: int = 1,
                     rows: int = QUANT_BLOCK_ROWS, dtype: torch.dtype | None = None) -> dict[str, PackedWeight]:
    """Each group's dense ``[N_i, K]`` tensors stacked along the output rows (a fused qkv from q, k and v) and
    quantized to ``fmt``, bit-identical to ``quantize_rows`` of their concatenation.

    Every block of ``rows`` rows of every tensor is one task on one pool of ``workers`` threads, so a small
    tensor's few blocks never leave threads idle while a large one waits, and each block's codes and scales are
    written straight into the result (no concatenation after). Torch's own intra-op threads drop to one
    meanwhile (process-wide: torch has no per-thread count): ``workers`` threads each running every op on all
    the CPUs oversubscribe them, which is what a many-core host pays most for."""
    whole = _QUANTIZERS[fmt]
    out, tasks = {}, []
    for name, tensors in groups.items():
        k = tensors[0].shape[1]
        assert all(t.dim() == 2 and t.shape[1] == k for t in tensors), (name, [tuple(t.shape) for t in tensors])
        out[name] = empty_packed(fmt, (sum(t.shape[0] for t in tensors), k), device="cpu")
        first = 0
        for tensor in tensors:
            tasks += [(out[name], first + i, tensor[i:i + rows]) for i in range(0, tensor.shape[0], rows)]
            first += tensor.shape[0]

    def quantize(task) -> None:
        packed, first, block = task
        with torch.inference_mode():    # thread-local: a caller's inference tensors are written in it too
            part = whole(block if dtype is None else block.to(dtype))
            for key, tensor in part.tensors().items():
                packed.tensors()[key][first:first + block.shape[0]].copy_(tensor)
    if workers <= 1:
        for task in tasks:
            quantize(task)
        return out
    with torch_threads(1), ThreadPoolExecutor(min(workers, len(tasks))) as pool:
        list(pool.map(quantize, tasks))
    return out


@contextmanager
def torch_threads(count: int):
    """Torch's intra-op thread count set to ``count`` for the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
