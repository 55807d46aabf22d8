"""``NativeOps``: the native CPU ops on torch tensors, one method per C function (``load_native_ops()`` in
``native.py`` builds and loads the library and hands out the handle).

Each wrapper takes torch tensors, checks what the C code assumes (CPU, dtype, the strides it reads: the checks are in
``native_checks.py``) and passes data pointers and element strides. ctypes releases the GIL for the call. Every
op runs on up to ``torch.get_num_threads()`` threads of torch's own OpenMP pool (the C code keeps one for small
work); the bits do not depend on the count.
"""
from __future__ import annotations

import ctypes

import torch

from gh200rt.backends.cpu.native_args import (DecodeLayerArgs, DecodeStepArgs, host_kv_args, host_pointer,
                                              linear_threads, quant_weight_args)
from gh200rt.backends.cpu.native_checks import (FP8_KV_TYPES, as_int64, check_dense_linear, check_pool, dtype_code,
                                                fp8_linear_fits, kv_type_args, paged_inputs, pool_args, table_rows)


class NativeOps:
    """The ops of ``kernels/cpu`` (layer_ops.c, kv_store.c, the attention kernels, the linears) on torch tensors.
    Per call the Python side costs a few microseconds (a new output tensor, pointers, strides), the same order as
    the work at decode sizes, so the checks are kept to what the C code relies on."""

    def __init__(self, library: ctypes.CDLL):
        self._lib = library

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dim = x.shape[-1]
        rows = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, dim)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        code = dtype_code(x, weight)
        if weight.shape != (dim,) or not weight.is_contiguous():
            raise ValueError(f"RMSNorm weight {tuple(weight.shape)} does not match rows of {dim}")
        self._lib.gh_rms_norm(rows.data_ptr(), rows.shape[0], dim, rows.stride(0), weight.data_ptr(),
                              out.data_ptr(), eps, code, torch.get_num_threads())
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` over the last dim ``[gate | up]``."""
        rows = gate_up if gate_up.is_contiguous() else gate_up.contiguous()
        inter = rows.shape[-1] // 2
        out = rows.new_empty((*rows.shape[:-1], inter))
        self._lib.gh_silu_mul(rows.data_ptr(), rows.numel() // (2 * inter) if inter else 0, inter, out.data_ptr(),
                              dtype_code(rows), torch.get_num_threads())
        return out

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x [T, heads, D]``, ``cos``/``sin`` ``[T, 1, D/2]`` (contiguous, x's dtype) -> rotated, contiguous."""
        tokens, heads, dim = x.shape
        if x.stride(-1) != 1:
            x = x.contiguous()
        if not (cos.is_contiguous() and sin.is_contiguous()) or cos.numel() != tokens * (dim // 2) \
                or sin.shape != cos.shape:
            raise ValueError(f"rotary tables {tuple(cos.shape)} / {tuple(sin.shape)} do not match {tokens} "
                             f"tokens of head size {dim} (contiguous [T, 1, D/2] expected)")
        out = x.new_empty((tokens, heads, dim))
        self._lib.gh_rotary(x.data_ptr(), tokens, heads, dim // 2, x.stride(0), x.stride(1), cos.data_ptr(),
                            sin.data_ptr(), out.data_ptr(), dtype_code(x, cos, sin), torch.get_num_threads())
        return out

    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                 kv_scale: torch.Tensor | None = None) -> None:
        """K/V ``[T, kv_heads, D]`` (cast to the pool's dtype) into ``kv_cache [2, blocks, block_size, kv_heads, D]``
        at ``slot_mapping`` (int64); negative slots are skipped. An fp8 pool is written as kv/fp8.py's quantize with
        ``kv_scale`` (float32 ``[K scale, V scale]``) from float32 or bfloat16 K/V."""
        fp8_pool = kv_cache.dtype in FP8_KV_TYPES
        if fp8_pool and v.dtype != k.dtype:
            v = v.to(k.dtype)
        elif not fp8_pool and k.dtype != kv_cache.dtype:
            k, v = k.to(kv_cache.dtype), v.to(kv_cache.dtype)
        if k.stride(-1) != 1:
            k = k.contiguous()
        if v.stride(-1) != 1:
            v = v.contiguous()
        slot_mapping = as_int64(slot_mapping)
        check_pool(kv_cache, k)
        if slot_mapping.device.type != "cpu" or slot_mapping.shape[0] != k.shape[0] or v.shape != k.shape:
            raise ValueError(f"write_kv: {slot_mapping.shape[0]} slots for K {tuple(k.shape)} and V {tuple(v.shape)}")
        rows = (k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0), v.stride(1), slot_mapping.data_ptr(),
                *k.shape)
        if fp8_pool:
            self._lib.gh_write_kv_fp8(*pool_args(kv_cache), *rows, dtype_code(k, v),
                                      *kv_type_args(k, kv_cache, kv_scale))
        else:
            dtype_code(k, v, kv_cache)
            self._lib.gh_write_kv(*pool_args(kv_cache), *rows, kv_cache.element_size())

    def decode_attention(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         seq_lens: torch.Tensor, scale: float, kv_scale: torch.Tensor | None = None,
                         host=None) -> torch.Tensor:
        """``q [B, heads, D]`` (one new token per sequence, at position seq_len - 1) -> ``out [B, heads, D]``.
        ``block_tables`` int32 ``[B, W]`` must cover ``seq_lens`` (int64 ``[B]``); the caller guarantees it. The
        pool holds q's dtype, or fp8 read with ``kv_scale`` (float32 ``[K scale, V scale]``, kv/fp8.py). ``host``:
        the layer's ``HostBlocksView``, whose blocks table entries from its ``first_id`` on name (read in place)."""
        q, block_tables, seq_lens = paged_inputs(q, kv_cache, block_tables, seq_lens)
        num_seqs, heads, dim = q.shape
        kv_heads = kv_cache.shape[3]
        if heads % kv_heads or block_tables.shape[0] != num_seqs or seq_lens.shape[0] != num_seqs:
            raise ValueError(f"decode_attention: q {tuple(q.shape)}, {kv_heads} KV heads, block tables "
                             f"{tuple(block_tables.shape)}, seq_lens {tuple(seq_lens.shape)}")
        out = q.new_empty((num_seqs, heads, dim))
        host_args = host_kv_args(host, kv_cache)      # alive until the call returns
        self._lib.gh_decode_attention(q.data_ptr(), q.stride(0), q.stride(1), *pool_args(kv_cache),
                                      block_tables.data_ptr(), block_tables.stride(0), seq_lens.data_ptr(), num_seqs,
                                      heads, kv_heads, dim, scale, out.data_ptr(), dtype_code(q),
                                      *kv_type_args(q, kv_cache, kv_scale), torch.get_num_threads(),
                                      host_pointer(host_args))
        return out

    def extend_attention(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         seq_lens: torch.Tensor, query_starts: torch.Tensor, scale: float,
                         kv_scale: torch.Tensor | None = None, host=None) -> torch.Tensor:
        """``q [T, heads, D]``: sequence b's new tokens are rows ``query_starts[b] .. query_starts[b + 1]`` (int64
        ``[B + 1]``, from 0) and the last of its ``seq_lens[b]`` positions, each seeing every key at or before it
        (K/V already in the pool) -> ``out [T, heads, D]``. ``block_tables`` int32 ``[B, W]`` must cover
        ``seq_lens`` (int64 ``[B]``); the caller guarantees it. The pool and ``host`` as ``decode_attention`` takes
        them."""
        q, block_tables, seq_lens = paged_inputs(q, kv_cache, block_tables, seq_lens)
        tokens, heads, dim = q.shape
        query_starts = as_int64(query_starts)
        kv_heads, num_seqs = kv_cache.shape[3], seq_lens.shape[0]
        if heads % kv_heads or block_tables.shape[0] != num_seqs or query_starts.shape[0] != num_seqs + 1:
            raise ValueError(f"extend_attention: q {tuple(q.shape)}, {kv_heads} KV heads, block tables "
                             f"{tuple(block_tables.shape)}, seq_lens {tuple(seq_lens.shape)}, query starts "
                             f"{tuple(query_starts.shape)}")
        out = q.new_empty((tokens, heads, dim))
        host_args = host_kv_args(host, kv_cache)
        if self._lib.gh_extend_attention(q.data_ptr(), q.stride(0), q.stride(1), *pool_args(kv_cache),
                                         block_tables.data_ptr(), block_tables.stride(0), seq_lens.data_ptr(),
                                         query_starts.data_ptr(), num_seqs, heads, kv_heads, dim, scale,
                                         out.data_ptr(), dtype_code(q), *kv_type_args(q, kv_cache, kv_scale),
                                         torch.get_num_threads(), host_pointer(host_args)):
            raise MemoryError("extend_attention: no memory for the tile index")
        return out

    def fp8_values(self, dtype: torch.dtype) -> torch.Tensor:
        """The float32 value the attention kernels give each of the 256 bytes of an fp8 ``dtype``."""
        codes, out = torch.arange(256, dtype=torch.uint8), torch.empty(256)
        self._lib.gh_fp8_values(codes.data_ptr(), 256, FP8_KV_TYPES[dtype], out.data_ptr())
        return out

    def decode_attention_block(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                               slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                               scale: float, heads: int, kv_heads: int,
                               kv_scale: torch.Tensor | None = None, host=None) -> torch.Tensor:
        """``rotary`` on the query and key heads of ``qkv [T, (heads + 2 kv_heads) * D]``, ``write_kv`` of the new
        K and V, ``decode_attention`` -> ``out [T, heads, D]``: the three ops' bits in one call. One token per
        sequence, in sequence order; ``cos``/``sin`` contiguous ``[T, 1, D/2]`` in qkv's dtype; the pool holds
        qkv's dtype, or fp8 with ``kv_scale``; ``host`` as ``decode_attention`` takes it."""
        tokens, width = qkv.shape
        dim = kv_cache.shape[-1]
        if qkv.stride(-1) != 1:
            qkv = qkv.contiguous()
        code = dtype_code(qkv, cos, sin)
        kind, kv_scale_ptr = kv_type_args(qkv, kv_cache, kv_scale)
        if width != (heads + 2 * kv_heads) * dim or kv_cache.shape[3] != kv_heads or heads % kv_heads \
                or not (cos.is_contiguous() and sin.is_contiguous()) or cos.numel() != tokens * (dim // 2) \
                or sin.shape != cos.shape or block_tables.shape[0] != tokens or seq_lens.shape[0] != tokens \
                or slot_mapping.shape[0] != tokens:
            raise ValueError(f"decode_attention_block: qkv {tuple(qkv.shape)}, {heads} / {kv_heads} heads, pool "
                             f"{tuple(kv_cache.shape)}, tables {tuple(cos.shape)}, block tables "
                             f"{tuple(block_tables.shape)}, seq_lens {tuple(seq_lens.shape)}")
        check_pool(kv_cache, qkv.view(tokens, -1, dim))
        block_tables = table_rows(block_tables)
        seq_lens = as_int64(seq_lens)
        slot_mapping = as_int64(slot_mapping)
        out = qkv.new_empty((tokens, heads, dim))
        strides = kv_cache.stride()
        host_args = host_kv_args(host, kv_cache)
        if self._lib.gh_decode_attention_block(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(),
                                               kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), strides[1], strides[2],
                                               strides[3], kv_cache.shape[2], slot_mapping.data_ptr(),
                                               block_tables.data_ptr(), block_tables.stride(0), seq_lens.data_ptr(),
                                               tokens, heads, kv_heads, dim, scale, out.data_ptr(), code, kind,
                                               kv_scale_ptr, torch.get_num_threads(),
                                               host_pointer(host_args)):
            raise MemoryError("decode_attention_block: no memory for the rotated heads")
        return out

    def quant_linear(self, x: torch.Tensor, weight) -> torch.Tensor:
        """``x [..., K]`` float32 times a ``PackedWeight`` int8 / int4 ``[N, K]`` (group size a multiple of 32 that
        divides K; ``quant_linear_fits``) -> float32 ``[..., N]``, on ``torch.get_num_threads()`` threads (one
        for weights too small to share). A decode step makes ~120 of these calls, so the per-call Python is
        kept to a cached argument block, one output tensor and the call."""
        args = quant_weight_args(weight)
        n, k = weight.shape
        rows = x if x.dim() == 2 and x.stride(-1) == 1 and x.dtype == torch.float32 else \
            x.reshape(-1, k).to(torch.float32).contiguous()
        out = torch.empty((rows.shape[0], n))
        if rows.shape[0] and self._lib.gh_quant_linear(rows.data_ptr(), rows.shape[0], rows.stride(0), args.pointer,
                                                       out.data_ptr(), n, linear_threads(n, k)):
            raise MemoryError(f"native quantized linear: no memory for its buffers ({rows.shape[0]} rows of {k})")
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], n)

    def f32_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., K] W^T (+ bias)`` for float32 CPU tensors, ``weight [N, K]`` read in place (any row stride,
        unit column stride), on ``torch.get_num_threads()`` threads (one for weights too small to share). A row's
        bits depend on that row and the weight's values alone (kernels/cpu/f32_linear.c)."""
        check_dense_linear("f32_linear", x, weight, bias, torch.float32)
        return self.f32_linear_checked(x, weight, bias)

    def f32_linear_checked(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``f32_linear`` for arguments the caller has checked (``backends.cpu.linear.native_rows``): a decode step makes
        ~120 of these calls, so the Python around the kernel is kept to one output tensor and the call."""
        return self._dense_linear(self._lib.gh_f32_linear, x, weight, bias)

    @staticmethod
    def _dense_linear(kernel, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      extra: tuple = ()) -> torch.Tensor:
        """One call of ``gh_f32_linear``, ``gh_f16_linear`` or ``gh_fp8_linear`` (the same arguments; ``extra``: the
        fp8 weight's scale pointer, scale row stride and group, after the weight's row stride) over checked tensors."""
        n, k = weight.shape
        rows = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, k)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()
        count = rows.shape[0]
        out = torch.empty((count, n))
        if count:
            kernel(rows.data_ptr(), count, rows.stride(0), weight.data_ptr(), n, k, weight.stride(0), *extra,
                   None if bias is None else bias.data_ptr(), out.data_ptr(), n, linear_threads(n, k))
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], n)

    def f16_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., K] W^T (+ bias)`` for float32 CPU x and an fp16 CPU ``weight [N, K]`` read in place (any row
        stride, unit column stride): ``f32_linear``'s bits over the float32 copy of the weight
        (kernels/cpu/f16_linear.c)."""
        check_dense_linear("f16_linear", x, weight, bias, torch.float16)
        return self.f16_linear_checked(x, weight, bias)

    def f16_linear_checked(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``f16_linear`` for arguments the caller has checked (``HalfWeight.linear``)."""
        return self._dense_linear(self._lib.gh_f16_linear, x, weight, bias)

    def fp8_linear(self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, group: int,
                   bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., K]`` (float32, CPU) times an e4m3fn ``qweight [N, K]`` (unit column stride) with float32 ``scale
        [N, groups]`` per ``group`` columns (a multiple of 8, or >= K), read in place: ``f32_linear``'s bits over
        the dequantized weight (kernels/cpu/fp8_linear.c)."""
        n, k = qweight.shape
        if not fp8_linear_fits(qweight, scale, group) or x.dtype != torch.float32 or not x.is_cpu \
                or x.shape[-1] != k or (bias is not None and (bias.dtype != torch.float32 or bias.shape != (n,))):
            raise ValueError(f"fp8_linear takes float32 CPU x [..., {k}], an e4m3fn weight [N, K] with unit column "
                             f"stride, float32 scales [N, ceil(K / group)] (group a multiple of 8 or >= K) and a "
                             f"float32 bias [N]; got x {tuple(x.shape)} {x.dtype}, weight {tuple(qweight.shape)} "
                             f"{qweight.dtype}, scale {tuple(scale.shape)} {scale.dtype}, group {group}")
        return self.fp8_linear_checked(x, qweight, scale, group, bias)

    def fp8_linear_checked(self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, group: int,
                           bias: torch.Tensor | None) -> torch.Tensor:
        """``fp8_linear`` for arguments the caller has checked (``packed_linear.linear``)."""
        return self._dense_linear(self._lib.gh_fp8_linear, x, qweight, bias,
                                  (scale.data_ptr(), scale.stride(0), group))

    def amx_available(self) -> bool:
        """Whether this CPU and OS run AMX bf16 tiles for this process (kernels/cpu/amx_linear.c)."""
        return bool(self._lib.gh_amx_available())

    def amx_pack(self, weight: torch.Tensor, gated_inter: int = 0) -> torch.Tensor:
        """A bf16 ``[N, K]`` weight (unit column stride) in ``amx_linear``'s tile layout: a flat bf16 tensor.
        ``gated_inter``: a gated MLP's ``[gate | up]`` weight of ``N = 2 * gated_inter`` rows, packed so that
        ``amx_linear(..., silu=True)`` can return ``silu(gate) * up`` (``gated_inter`` a multiple of 16)."""
        if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.device.type != "cpu" or weight.stride(1) != 1:
            raise ValueError(f"amx_pack takes a bf16 [N, K] CPU weight with unit column stride, got {weight.dtype} "
                             f"{tuple(weight.shape)} on {weight.device}")
        n, k = weight.shape
        if gated_inter and (gated_inter % 16 or n != 2 * gated_inter):
            raise ValueError(f"a gated weight has 2 x {gated_inter} rows, a multiple of 16 each; got {n}")
        packed = torch.empty(self._lib.gh_amx_packed_elems(n, k), dtype=torch.bfloat16)
        self._lib.gh_amx_pack(weight.data_ptr(), n, k, weight.stride(0), gated_inter, packed.data_ptr())
        return packed

    def bf16_dot_available(self) -> bool:
        """Whether this build runs the AVX-512 BF16 dot-product linear (kernels/cpu/bf16_dot_linear.c)."""
        return bool(self._lib.gh_bf16_dot_available())

    def amx_linear(self, x: torch.Tensor, packed: torch.Tensor, n: int, k: int, bias: torch.Tensor | None = None,
                   gated_inter: int = 0, silu: bool = False) -> torch.Tensor:
        """``x [..., K]`` bf16 times the ``[N, K]`` weight ``amx_pack`` made with the same ``gated_inter`` (+ ``bias``,
        float32 ``[N]``) -> bf16 ``[..., N]``; K a multiple of 32. With ``silu`` (a gated weight, no bias):
        ``silu(gate) * up``, ``[..., gated_inter]``, with the bits of the product followed by ``silu_mul``. A row's
        bits depend on that row and the weight alone: not on the call's row count nor the threads
        (kernels/cpu/amx_linear.c)."""
        return self._tiled_linear(self._lib.gh_amx_linear, "AMX", x, packed, n, k, bias, gated_inter, silu)

    def bf16_dot_linear(self, x: torch.Tensor, packed: torch.Tensor, n: int, k: int, bias: torch.Tensor | None = None,
                        gated_inter: int = 0, silu: bool = False) -> torch.Tensor:
        """``amx_linear``'s contract over the same packed weight, on AVX-512 BF16 dot products (CPUs without AMX; its
        bits are not AMX's): kernels/cpu/bf16_dot_linear.c."""
        return self._tiled_linear(self._lib.gh_bf16_dot_linear, "AVX-512 BF16", x, packed, n, k, bias, gated_inter,
                                  silu)

    @staticmethod
    def _tiled_linear(kernel, name: str, x: torch.Tensor, packed: torch.Tensor, n: int, k: int,
                      bias: torch.Tensor | None, gated_inter: int, silu: bool) -> torch.Tensor:
        rows = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, k)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        count, width = rows.shape[0], gated_inter if silu else n
        out = torch.empty((count, width), dtype=torch.bfloat16)
        if kernel(rows.data_ptr(), count, rows.stride(0), packed.data_ptr(), n, k,
                  None if bias is None else bias.data_ptr(), out.data_ptr(), width, linear_threads(n, k),
                  gated_inter, int(silu)):
            raise RuntimeError(f"native {name} linear failed ({count} rows of {k}, gated {gated_inter}, silu {silu}, "
                               f"bias {bias is not None}): {name} unavailable, arguments that do not fit, or no memory")
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], width)

    def decode_layer(self, hidden: torch.Tensor, args: "DecodeLayerArgs", out: torch.Tensor) -> None:
        """``out [rows, hidden]`` = one decoder layer over contiguous ``hidden [rows, hidden]`` (a decode step: one
        token per sequence; float32, or bfloat16 with ``args.dtype`` 1), with everything else in ``args``
        (kernels/cpu/decode_layer.c). The caller
        (gh200rt/backends/cpu/decode_layer.py) builds ``args`` from what the layer-by-layer path would call."""
        if self._lib.gh_decode_layer(hidden.data_ptr(), hidden.shape[0], ctypes.addressof(args), out.data_ptr()):
            raise MemoryError(f"native decode layer: no memory for its buffers ({hidden.shape[0]} rows)")

    def decode_layers(self, hidden: torch.Tensor, layers, count: int, step: "DecodeStepArgs",
                      out: torch.Tensor) -> None:
        """``out`` = the ``count`` decoder layers of ``layers`` (a ctypes array of ``DecodeLayerArgs`` pointers) one
        after another over ``hidden``, each as ``decode_layer`` runs it with ``step``'s fields."""
        if self._lib.gh_decode_layers(hidden.data_ptr(), hidden.shape[0], layers, count, ctypes.addressof(step),
                                      out.data_ptr()):
            raise MemoryError(f"native decode layers: no memory for their buffers ({hidden.shape[0]} rows)")

    def dequantize(self, weight) -> torch.Tensor:
        """The dense float32 ``[N, K]`` weight, with ``PackedWeight.dequantize()``'s bits."""
        out = torch.empty(weight.shape)
        self._lib.gh_dequantize(quant_weight_args(weight).pointer, out.data_ptr(), torch.get_num_threads())
        return out
