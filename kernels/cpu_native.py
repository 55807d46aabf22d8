"""The native CPU ops (``kernels/cpu/ops.c``): compiled once per machine, called through ctypes.

``load_native_ops()`` returns a ``NativeOps`` handle or None with the reason in ``native_ops_error()``: it
needs a C compiler (``$CC``, else ``cc``/``gcc``/``clang``) on a Linux or macOS host. The library is
built with ``-march=native`` into ``$GH200RT_CACHE_DIR`` (default ``~/.cache/gh200rt``) under a name
that hashes the source, the compiler's version, the flags and this CPU's model and features, so a
shared home directory never hands one machine's build to another; later processes load it in
milliseconds. No torch headers are involved, so a build takes about a second.

Each wrapper takes torch tensors, checks what the C code assumes (CPU, dtype, the strides it reads)
and passes data pointers and element strides. ctypes releases the GIL for the call. Every op runs on
up to ``torch.get_num_threads()`` threads of torch's own OpenMP pool (the C code keeps one for small work);
the bits do not depend on the count.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).with_name("cpu") / name
                for name in ("ops.c", "quant_linear.c", "f32_linear.c", "f16_linear.c", "decode_layer.c"))
HEADERS = tuple(Path(__file__).with_name("cpu") / name for name in ("gh_native.h", "f32_acc.h"))
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared", "-std=c11")
# the ops' threads: the libgomp torch has loaded (same soname), so they run on torch's own pool
OPENMP = ("-fopenmp",)
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
# a KV pool's element type when it is not the query's: fp8, read with the layer's [K scale, V scale] (kv/fp8.py)
FP8_KV_TYPES = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}

_P, _I, _F, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
SIGNATURES = {
    "gh_rms_norm": (_P, _I, _I, _I, _P, _P, _F, _C, _I),
    "gh_silu_mul": (_P, _I, _I, _P, _C, _I),
    "gh_rotary": (_P, _I, _I, _I, _I, _I, _P, _P, _P, _C, _I),
    "gh_write_kv": (_P, _P, _I, _I, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I, _I),
    "gh_decode_attention": (_P, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _P, _I, _I, _I, _I, _F, _P, _C, _C, _P, _I),
    "gh_extend_attention": (_P, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _P, _P, _I, _I, _I, _I, _F, _P, _C, _C, _P,
                            _I),
    "gh_fp8_values": (_P, _I, _C, _P),
    "gh_decode_attention_block": (_P, _I, _P, _P, _P, _P, _I, _I, _I, _I, _P, _P, _I, _P, _I, _I, _I, _I, _F, _P, _C,
                                  _C, _P, _I),
    "gh_write_kv_fp8": (_P, _P, _I, _I, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I, _C, _C, _P),
    "gh_quant_linear": (_P, _I, _I, _P, _P, _I, _I),
    "gh_dequantize": (_P, _P, _I),
    "gh_f32_linear": (_P, _I, _I, _P, _I, _I, _I, _P, _P, _I, _I),
    "gh_f16_linear": (_P, _I, _I, _P, _I, _I, _I, _P, _P, _I, _I),
    "gh_decode_layer": (_P, _I, _P, _P),
}
RESTYPES = {"gh_quant_linear": ctypes.c_int, "gh_decode_attention_block": ctypes.c_int, "gh_decode_layer": ctypes.c_int,
            "gh_extend_attention": ctypes.c_int}

_error: str | None = None


class NativeOpsError(RuntimeError):
    pass


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_identity() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _build(cc: str) -> Path:
    source = b"\0".join(path.read_bytes() for path in SOURCES + HEADERS)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, version.encode(), " ".join(FLAGS + OPENMP).encode(),
                                      _cpu_identity().encode()])).hexdigest()[:16]
    cache = Path(os.environ.get("GH200RT_CACHE_DIR") or Path.home() / ".cache" / "gh200rt") / "native"
    target = cache / f"gh200rt_cpu_ops_{key}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        built = Path(tmp) / target.name
        command = [cc, *FLAGS, "-o", str(built), *map(str, SOURCES), "-lm"]
        done = subprocess.run(command[:1] + list(OPENMP) + command[1:], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:  # a compiler without OpenMP: the quantized linears run on one thread
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise NativeOpsError(f"{cc} failed to build {', '.join(p.name for p in SOURCES)}: "
                                 f"{done.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent process loads either none or a whole library
    return target


def _load() -> "NativeOps":
    if platform.system() not in ("Linux", "Darwin"):
        raise NativeOpsError(f"native CPU ops are built on Linux and macOS only, not {platform.system()}")
    cc = _compiler()
    if cc is None:
        raise NativeOpsError("no C compiler found (set $CC or install gcc/clang)")
    library = ctypes.CDLL(str(_build(cc)))
    for name, argtypes in SIGNATURES.items():
        getattr(library, name).argtypes = argtypes
        getattr(library, name).restype = RESTYPES.get(name)
    return NativeOps(library)


@functools.lru_cache(maxsize=1)
def load_native_ops() -> "NativeOps | None":
    global _error
    try:
        return _load()
    except (NativeOpsError, OSError, subprocess.SubprocessError) as exc:
        _error = str(exc)
        return None


def native_ops_error() -> str | None:
    """Why ``load_native_ops()`` returned None (None when it has not failed)."""
    return _error


def _code(x: torch.Tensor, *others: torch.Tensor) -> int:
    """The C dtype code of ``x``, checking that ``others`` match it and that all are CPU tensors."""
    code = DTYPES.get(x.dtype)
    ok = code is not None and x.is_cpu
    for t in others:
        ok = ok and t.dtype == x.dtype and t.is_cpu
    if not ok:
        raise TypeError(f"native CPU ops take float32 or bfloat16 CPU tensors of one dtype, got "
                        f"{[(t.dtype, t.device.type) for t in (x, *others)]}")
    return code


class NativeOps:
    """The ops of ``kernels/cpu/ops.c`` on torch tensors. Per call the Python side costs a few microseconds
    (a new output tensor, pointers, strides), the same order as the work at decode sizes, so the checks
    are kept to what the C code relies on."""

    def __init__(self, library: ctypes.CDLL):
        self._lib = library

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dim = x.shape[-1]
        rows = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, dim)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        code = _code(x, weight)
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
                              _code(rows), torch.get_num_threads())
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
                            sin.data_ptr(), out.data_ptr(), _code(x, cos, sin), torch.get_num_threads())
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
        slot_mapping = _int64(slot_mapping)
        _check_pool(kv_cache, k)
        if slot_mapping.device.type != "cpu" or slot_mapping.shape[0] != k.shape[0] or v.shape != k.shape:
            raise ValueError(f"write_kv: {slot_mapping.shape[0]} slots for K {tuple(k.shape)} and V {tuple(v.shape)}")
        rows = (k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0), v.stride(1), slot_mapping.data_ptr(),
                *k.shape)
        if fp8_pool:
            self._lib.gh_write_kv_fp8(*_pool_args(kv_cache), *rows, _code(k, v), *_kv_type(k, kv_cache, kv_scale))
        else:
            _code(k, v, kv_cache)
            self._lib.gh_write_kv(*_pool_args(kv_cache), *rows, kv_cache.element_size())

    def decode_attention(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         seq_lens: torch.Tensor, scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``q [B, heads, D]`` (one new token per sequence, at position seq_len - 1) -> ``out [B, heads, D]``.
        ``block_tables`` int32 ``[B, W]`` must cover ``seq_lens`` (int64 ``[B]``); the caller guarantees it. The
        pool holds q's dtype, or fp8 read with ``kv_scale`` (float32 ``[K scale, V scale]``, kv/fp8.py)."""
        q, block_tables, seq_lens = _paged_inputs(q, kv_cache, block_tables, seq_lens)
        num_seqs, heads, dim = q.shape
        kv_heads = kv_cache.shape[3]
        if heads % kv_heads or block_tables.shape[0] != num_seqs or seq_lens.shape[0] != num_seqs:
            raise ValueError(f"decode_attention: q {tuple(q.shape)}, {kv_heads} KV heads, block tables "
                             f"{tuple(block_tables.shape)}, seq_lens {tuple(seq_lens.shape)}")
        out = q.new_empty((num_seqs, heads, dim))
        self._lib.gh_decode_attention(q.data_ptr(), q.stride(0), q.stride(1), *_pool_args(kv_cache),
                                      block_tables.data_ptr(), block_tables.stride(0), seq_lens.data_ptr(), num_seqs,
                                      heads, kv_heads, dim, scale, out.data_ptr(), _code(q),
                                      *_kv_type(q, kv_cache, kv_scale), torch.get_num_threads())
        return out

    def extend_attention(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         seq_lens: torch.Tensor, query_starts: torch.Tensor, scale: float,
                         kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``q [T, heads, D]``: sequence b's new tokens are rows ``query_starts[b] .. query_starts[b + 1]`` (int64
        ``[B + 1]``, from 0) and the last of its ``seq_lens[b]`` positions, each seeing every key at or before it
        (K/V already in the pool) -> ``out [T, heads, D]``. ``block_tables`` int32 ``[B, W]`` must cover
        ``seq_lens`` (int64 ``[B]``); the caller guarantees it. The pool as ``decode_attention`` takes it."""
        q, block_tables, seq_lens = _paged_inputs(q, kv_cache, block_tables, seq_lens)
        tokens, heads, dim = q.shape
        query_starts = _int64(query_starts)
        kv_heads, num_seqs = kv_cache.shape[3], seq_lens.shape[0]
        if heads % kv_heads or block_tables.shape[0] != num_seqs or query_starts.shape[0] != num_seqs + 1:
            raise ValueError(f"extend_attention: q {tuple(q.shape)}, {kv_heads} KV heads, block tables "
                             f"{tuple(block_tables.shape)}, seq_lens {tuple(seq_lens.shape)}, query starts "
                             f"{tuple(query_starts.shape)}")
        out = q.new_empty((tokens, heads, dim))
        if self._lib.gh_extend_attention(q.data_ptr(), q.stride(0), q.stride(1), *_pool_args(kv_cache),
                                         block_tables.data_ptr(), block_tables.stride(0), seq_lens.data_ptr(),
                                         query_starts.data_ptr(), num_seqs, heads, kv_heads, dim, scale,
                                         out.data_ptr(), _code(q), *_kv_type(q, kv_cache, kv_scale),
                                         torch.get_num_threads()):
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
                               kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``rotary`` on the query and key heads of ``qkv [T, (heads + 2 kv_heads) * D]``, ``write_kv`` of the new
        K and V, ``decode_attention`` -> ``out [T, heads, D]``: the three ops' bits in one call. One token per
        sequence, in sequence order; ``cos``/``sin`` contiguous ``[T, 1, D/2]`` in qkv's dtype; the pool holds
        qkv's dtype, or fp8 with ``kv_scale``."""
        tokens, width = qkv.shape
        dim = kv_cache.shape[-1]
        if qkv.stride(-1) != 1:
            qkv = qkv.contiguous()
        code = _code(qkv, cos, sin)
        kind, kv_scale_ptr = _kv_type(qkv, kv_cache, kv_scale)
        if width != (heads + 2 * kv_heads) * dim or kv_cache.shape[3] != kv_heads or heads % kv_heads \
                or not (cos.is_contiguous() and sin.is_contiguous()) or cos.numel() != tokens * (dim // 2) \
                or sin.shape != cos.shape or block_tables.shape[0] != tokens or seq_lens.shape[0] != tokens \
                or slot_mapping.shape[0] != tokens:
            raise ValueError(f"decode_attention_block: qkv {tuple(qkv.shape)}, {heads} / {kv_heads} heads, pool "
                             f"{tuple(kv_cache.shape)}, tables {tuple(cos.shape)}, block tables "
                             f"{tuple(block_tables.shape)}, seq_lens {tuple(seq_lens.shape)}")
        _check_pool(kv_cache, qkv.view(tokens, -1, dim))
        block_tables = _table_rows(block_tables)
        seq_lens = _int64(seq_lens)
        slot_mapping = _int64(slot_mapping)
        out = qkv.new_empty((tokens, heads, dim))
        strides = kv_cache.stride()
        if self._lib.gh_decode_attention_block(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(),
                                               kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), strides[1], strides[2],
                                               strides[3], kv_cache.shape[2], slot_mapping.data_ptr(),
                                               block_tables.data_ptr(), block_tables.stride(0), seq_lens.data_ptr(),
                                               tokens, heads, kv_heads, dim, scale, out.data_ptr(), code, kind,
                                               kv_scale_ptr, torch.get_num_threads()):
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
        _check_dense_linear("f32_linear", x, weight, bias, torch.float32)
        return self.f32_linear_checked(x, weight, bias)

    def f32_linear_checked(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``f32_linear`` for arguments the caller has checked (``cpu_linear.native_rows``): a decode step makes
        ~120 of these calls, so the Python around the kernel is kept to one output tensor and the call."""
        return self._dense_linear(self._lib.gh_f32_linear, x, weight, bias)

    @staticmethod
    def _dense_linear(kernel, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """One call of ``gh_f32_linear`` or ``gh_f16_linear`` (the same arguments) over checked tensors."""
        n, k = weight.shape
        rows = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, k)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()
        count = rows.shape[0]
        out = torch.empty((count, n))
        if count:
            kernel(rows.data_ptr(), count, rows.stride(0), weight.data_ptr(), n, k, weight.stride(0),
                   None if bias is None else bias.data_ptr(), out.data_ptr(), n, linear_threads(n, k))
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], n)

    def f16_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., K] W^T (+ bias)`` for float32 CPU x and an fp16 CPU ``weight [N, K]`` read in place (any row
        stride, unit column stride): ``f32_linear``'s bits over the float32 copy of the weight
        (kernels/cpu/f16_linear.c)."""
        _check_dense_linear("f16_linear", x, weight, bias, torch.float16)
        return self.f16_linear_checked(x, weight, bias)

    def f16_linear_checked(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``f16_linear`` for arguments the caller has checked (``HalfWeight.linear``)."""
        return self._dense_linear(self._lib.gh_f16_linear, x, weight, bias)

    def decode_layer(self, hidden: torch.Tensor, args: "DecodeLayerArgs", out: torch.Tensor) -> None:
        """``out [rows, hidden]`` = one decoder layer over contiguous float32 ``hidden [rows, hidden]`` (a decode
        step: one token per sequence), with everything else in ``args`` (kernels/cpu/decode_layer.c). The caller
        (gh200rt/models/cpu_decode_layer.py) builds ``args`` from what the layer-by-layer path would call."""
        if self._lib.gh_decode_layer(hidden.data_ptr(), hidden.shape[0], ctypes.addressof(args), out.data_ptr()):
            raise MemoryError(f"native decode layer: no memory for its buffers ({hidden.shape[0]} rows)")

    def dequantize(self, weight) -> torch.Tensor:
        """The dense float32 ``[N, K]`` weight, with ``PackedWeight.dequantize()``'s bits."""
        out = torch.empty(weight.shape)
        self._lib.gh_dequantize(quant_weight_args(weight).pointer, out.data_ptr(), torch.get_num_threads())
        return out


# below this many weights a quantized linear runs on one thread: waking a second costs more than it saves
SHARED_WEIGHT_ELEMENTS = 1 << 17


class _WeightArgs(ctypes.Structure):
    """quant_linear.c's WeightArgs."""
    _fields_ = [("q", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("minimum", ctypes.c_void_p),
                ("fmt", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("group", ctypes.c_int64)]


class QuantWeight:
    """The argument block of one packed weight, built once: its storage's addresses never change (a staging
    slot's contents do, which the kernel reads afresh on every call)."""
    __slots__ = ("args", "pointer")

    def __init__(self, weight):
        if not quant_linear_fits(weight):
            raise ValueError(f"the native quantized linear takes int8 / int4 CPU weights with groups of a multiple "
                             f"of 32 columns that divide K, got {weight!r}")
        n, k = weight.shape
        minimum = weight.minimum.data_ptr() if weight.minimum is not None else None
        self.args = _WeightArgs(weight.qweight.data_ptr(), weight.scale.data_ptr(), minimum,
                                0 if weight.fmt == "int8" else 1, n, k, weight.group_size)
        self.pointer = ctypes.addressof(self.args)


class LinearArgs(ctypes.Structure):
    """decode_layer.c's LinearArgs: one linear as the layer-by-layer path would call it."""
    _fields_ = [("kind", _I), ("w", _P), ("w_stride", _I), ("packed", _P), ("bias", _P), ("n", _I), ("k", _I),
                ("threads", _I)]


LINEAR_F32, LINEAR_QUANT, LINEAR_F16 = 0, 1, 2


class DecodeLayerArgs(ctypes.Structure):
    """decode_layer.c's DecodeLayerArgs."""
    _fields_ = [("qkv", LinearArgs), ("o", LinearArgs), ("gate_up", LinearArgs), ("down", LinearArgs),
                ("norm1", _P), ("norm2", _P), ("eps", _F), ("scale", _F), ("cos", _P), ("sin", _P),
                ("k_cache", _P), ("v_cache", _P), ("block_stride", _I), ("slot_stride", _I), ("head_stride", _I),
                ("block_size", _I), ("slots", _P), ("block_tables", _P), ("table_stride", _I), ("seq_lens", _P),
                ("heads", _I), ("kv_heads", _I), ("head_dim", _I), ("hidden", _I), ("inter", _I), ("threads", _I),
                ("kv_type", _I), ("kv_scale", _P)]


def linear_threads(n: int, k: int) -> int:
    """The threads a native linear of ``[n, k]`` weights runs on: one below ``SHARED_WEIGHT_ELEMENTS``."""
    return torch.get_num_threads() if n * k >= SHARED_WEIGHT_ELEMENTS else 1


def quant_weight_args(weight) -> QuantWeight:
    """``weight``'s cached ``QuantWeight`` (kept on the weight, whose tensors it points into)."""
    args = getattr(weight, "_native_args", None)
    if args is None:
        args = QuantWeight(weight)
        weight._native_args = args
    return args


def quant_linear_fits(weight) -> bool:
    """Whether the native quantized linear takes this ``PackedWeight``: int8 or int4 on the CPU, contiguous
    storage, groups of a multiple of 32 columns that divide K."""
    n, k = weight.shape
    tensors = weight.tensors().values()
    return (weight.fmt in ("int8", "int4") and weight.group_size % 32 == 0 and k % weight.group_size == 0
            and all(t.is_cpu and t.is_contiguous() for t in tensors))


def _table_rows(block_tables: torch.Tensor) -> torch.Tensor:
    """Block tables as the C code reads them: int32, unit last stride (rows may sit apart)."""
    if block_tables.dtype != torch.int32 or block_tables.stride(-1) != 1:
        return block_tables.to(torch.int32).contiguous()
    return block_tables


def _int64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 and t.is_contiguous() else t.to(torch.int64).contiguous()


def _paged_inputs(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An attention call's query rows (unit last stride), block tables and sequence lengths as the C code reads
    them, after checking the pool's layout."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    _check_pool(kv_cache, q)
    return q, _table_rows(block_tables), _int64(seq_lens)


def _pool_args(kv_cache: torch.Tensor) -> tuple[int, ...]:
    """K and V planes, then the block, slot and head strides (elements) and the block size."""
    strides = kv_cache.stride()
    return (kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), strides[1], strides[2], strides[3], kv_cache.shape[2])


def _check_dense_linear(name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
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


def _kv_type(q: torch.Tensor, kv_cache: torch.Tensor, kv_scale: torch.Tensor | None) -> tuple[int, int | None]:
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


def _check_pool(kv_cache: torch.Tensor, rows: torch.Tensor) -> None:
    """The pool layout the C code indexes: [2, blocks, block_size, kv_heads, head_dim], unit last stride."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or kv_cache.stride(-1) != 1 \
            or kv_cache.shape[-1] != rows.shape[-1] or kv_cache.device.type != "cpu":
        raise ValueError(f"expected a CPU KV pool [2, blocks, block_size, kv_heads, {rows.shape[-1]}] with a unit "
                         f"last stride, got {tuple(kv_cache.shape)} strides {kv_cache.stride()} on {kv_cache.device}")
