"""What the native CPU ops (``native_ops.py``) check of their tensor arguments, and how they hand them to C.

The C dtype codes (``DTYPES``, ``FP8_KV_TYPES``), the KV pool's layout and element type, block tables as int32 rows
and lengths as int64, the pool's planes and strides as arguments, and the dense linears' operands. The underscored
helpers serve ``NativeOps`` alone; the constants are read by the model's CPU routes too.
"""
from __future__ import annotations

import torch

DTYPES = {torch.float32: 0, torch.bfloat16: 1}
# a KV pool's element type when it is not the query's: fp8, read with the layer's [K scale, V scale] (kv/fp8.py)
FP8_KV_TYPES = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}


def dtype_code(x: torch.Tensor, *others: torch.Tensor) -> int:
    """The C dtype code of ``x``, checking that ``others`` match it and that all are CPU tensors."""
    code = DTYPES.get(x.dtype)
    ok = code is not None and x.is_cpu
    for t in others:
        ok = ok and t.dtype == x.dtype and t.is_cpu
    if not ok:
        raise TypeError(f"native CPU ops take float32 or bfloat16 CPU tensors of one dtype, got "
                        f"{[(t.dtype, t.device.type) for t in (x, *others)]}")
    return code


def table_rows(block_tables: torch.Tensor) -> torch.Tensor:
    """Block tables as the C code reads them: int32, unit last stride (rows may sit apart)."""
    if block_tables.dtype != torch.int32 or block_tables.stride(-1) != 1:
        return block_tables.to(torch.int32).contiguous()
    return block_tables


def as_int64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()


def paged_inputs(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An attention call's query rows (unit last stride), block tables and sequence lengths as the C code reads
    them, after checking the pool's layout."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    check_pool(kv_cache, q)
    return q, table_rows(block_tables), as_int64(seq_lens)


def pool_args(kv_cache: torch.Tensor) -> tuple[int, ...]:
    """K and V planes, then the block, slot and head strides (elements) and the block size."""
    strides = kv_cache.stride()
    return (kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), strides[1], strides[2], strides[3], kv_cache.shape[2])


def check_dense_linear(name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        weight_dtype: torch.dtype) -> None:
    """What ``gh_f32_linear`` / ``gh_f16_linear`` read: float32 CPU rows, a CPU ``weight_dtype`` weight [N, K] with unit
    column stride, a float32 CPU bias [N] or none."""
    n, k = weight.shape
    if x.dtype != torch.float32 or weight.dtype != weight_dtype or weight.stride(-1) != 1 or x.shape[-1] != k \
            or not (x.is_cpu and weight.is_cpu) or (bias is not None and (bias.dtype != torch.float32 or
                                                                           bias.shape != (n,) or not bias.is_cpu)):
        raise ValueError(f"{name} takes float32 CPU x [..., {k}], a {weight_dtype} weight [N, K] with unit column "
                         f"stride and a float32 bias [N], got x {tuple(x.shape)} {x.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype} strides {weight.stride()}"
                         + ("" if bias is None else f", bias {tuple(bias.shape)} {bias.dtype}"))


def fp8_linear_fits(qweight: torch.Tensor, scale: torch.Tensor, group: int) -> bool:
    """Whether ``gh_fp8_linear`` reads this weight in place: e4m3fn codes [N, K] on the CPU with unit column stride,
    float32 CPU scales [N, ceil(K / group)] with unit column stride, ``group`` a multiple of 8 or the whole row."""
    n, k = qweight.shape
    return (qweight.dtype == torch.float8_e4m3fn and qweight.is_cpu and qweight.stride(-1) == 1
            and scale.dtype == torch.float32 and scale.is_cpu and scale.dim() == 2 and scale.stride(-1) == 1
            and tuple(scale.shape) == (n, -(-k // group)) and (group % 8 == 0 or group >= k))


def kv_type_args(q: torch.Tensor, kv_cache: torch.Tensor, kv_scale: torch.Tensor | None) -> tuple[int, int | None]:
    """The C code's pool element type and scale pointer: 0 and none for a pool of q's dtype, an fp8 type with the
    layer's float32 ``[K scale, V scale]`` (read at call time)."""
    if kv_cache.dtype == q.dtype:
        return 0, None
    kind = FP8_KV_TYPES.get(kv_cache.dtype)
    if kind is None or kv_scale is None or kv_scale.dtype != torch.float32 or kv_scale.shape != (2,) \
            or not kv_scale.is_cpu or not kv_scale.is_contiguous():
        raise TypeError(f"native attention reads a pool of the query's dtype ({q.dtype}) or an fp8 pool with a "
                        f"float32 [K scale, V scale] tensor, got a {kv_cache.dtype} pool and kv_scale "
                        f"{None if kv_scale is None else (kv_scale.dtype, tuple(kv_scale.shape))}")
    return kind, kv_scale.data_ptr()


def check_pool(kv_cache: torch.Tensor, rows: torch.Tensor) -> None:
    """The pool layout the C code indexes: [2, blocks, block_size, kv_heads, head_dim], unit last stride."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or kv_cache.stride(-1) != 1 \
            or kv_cache.shape[-1] != rows.shape[-1] or kv_cache.device.type != "cpu":
        raise ValueError(f"expected a CPU KV pool [2, blocks, block_size, kv_heads, {rows.shape[-1]}] with a unit "
                         f"last stride, got {tuple(kv_cache.shape)} strides {kv_cache.stride()} on {kv_cache.device}")
