"""The native CPU library (``kernels/cpu/*.c``): compiled once per machine, loaded through ctypes.

``load_native_ops()`` returns a ``NativeOps`` handle (``native_ops.py``: the ops on torch tensors) or None with
the reason in ``native_ops_error()``: it needs a C compiler (``$CC``, else ``cc``/``gcc``/``clang``) on a Linux or
macOS host. The library is built with ``-march=native`` into ``$GH200RT_CACHE_DIR`` (default ``~/.cache/gh200rt``)
under a name that hashes the source, the compiler's version, the flags and this CPU's model and features, so a
shared home directory never hands one machine's build to another; later processes load it in milliseconds. No
torch headers are involved, so a build takes about a second. ``SIGNATURES`` gives every C function's ctypes
argument types. ``build_library(sources, headers)`` builds and loads other sources the same way (a benchmark's
baseline: another tree's ``kernels/cpu``).
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

import gh200rt.kernels
from gh200rt.backends.cpu.native_ops import NativeOps

# the C sources live with the kernels (kernels/cpu/, installed as gh200rt/kernels/cpu/)
C_SOURCE_DIR = Path(gh200rt.kernels.__file__).with_name("cpu")
SOURCES = tuple(C_SOURCE_DIR / name
                for name in ("layer_ops.c", "kv_store.c", "extend_attention.c", "decode_attention.c", "quant_linear.c",
                             "f32_linear.c", "f16_linear.c", "fp8_linear.c", "decode_layer.c", "amx_linear.c",
                             "bf16_dot_linear.c"))
HEADERS = tuple(C_SOURCE_DIR / name
                for name in ("gh_native.h", "gh_ops.h", "gh_attention.h", "f32_acc.h", "exp_f32.h", "bf16_store.h",
                             "tiled_linear.h", "gh_decode_layer.h"))
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared", "-std=c11")
# the ops' threads: the libgomp torch has loaded (same soname), so they run on torch's own pool
OPENMP = ("-fopenmp",)

_P, _I, _F, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
SIGNATURES = {
    "gh_rms_norm": (_P, _I, _I, _I, _P, _P, _F, _C, _I),
    "gh_silu_mul": (_P, _I, _I, _P, _C, _I),
    "gh_rotary": (_P, _I, _I, _I, _I, _I, _P, _P, _P, _C, _I),
    "gh_write_kv": (_P, _P, _I, _I, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I, _I),
    "gh_decode_attention": (_P, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _P, _I, _I, _I, _I, _F, _P, _C, _C, _P, _I,
                            _P),
    "gh_extend_attention": (_P, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _P, _P, _I, _I, _I, _I, _F, _P, _C, _C, _P,
                            _I, _P),
    "gh_fp8_values": (_P, _I, _C, _P),
    "gh_decode_attention_block": (_P, _I, _P, _P, _P, _P, _I, _I, _I, _I, _P, _P, _I, _P, _I, _I, _I, _I, _F, _P, _C,
                                  _C, _P, _I, _P),
    "gh_write_kv_fp8": (_P, _P, _I, _I, _I, _I, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I, _C, _C, _P),
    "gh_quant_linear": (_P, _I, _I, _P, _P, _I, _I),
    "gh_dequantize": (_P, _P, _I),
    "gh_f32_linear": (_P, _I, _I, _P, _I, _I, _I, _P, _P, _I, _I),
    "gh_f16_linear": (_P, _I, _I, _P, _I, _I, _I, _P, _P, _I, _I),
    "gh_fp8_linear": (_P, _I, _I, _P, _I, _I, _I, _P, _I, _I, _P, _P, _I, _I),
    "gh_decode_layer": (_P, _I, _P, _P),
    "gh_decode_layers": (_P, _I, _P, _I, _P, _P),
    "gh_amx_available": (),
    "gh_amx_packed_elems": (_I, _I),
    "gh_amx_pack": (_P, _I, _I, _I, _I, _P),
    "gh_amx_linear": (_P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _C),
    "gh_bf16_dot_available": (),
    "gh_bf16_dot_linear": (_P, _I, _I, _P, _I, _I, _P, _P, _I, _I, _I, _C),
}
RESTYPES = {"gh_quant_linear": ctypes.c_int, "gh_decode_attention_block": ctypes.c_int, "gh_decode_layer": ctypes.c_int,
            "gh_decode_layers": ctypes.c_int, "gh_extend_attention": ctypes.c_int, "gh_amx_available": ctypes.c_int,
            "gh_amx_packed_elems": _I,
            "gh_amx_linear": ctypes.c_int, "gh_bf16_dot_available": ctypes.c_int, "gh_bf16_dot_linear": ctypes.c_int}

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


def _build(cc: str, sources: tuple[Path, ...], headers: tuple[Path, ...]) -> Path:
    source = b"\0".join(path.read_bytes() for path in sources + headers)
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
        command = [cc, *FLAGS, "-o", str(built), *map(str, sources), "-lm"]
        done = subprocess.run(command[:1] + list(OPENMP) + command[1:], capture_output=True, text=True, timeout=300)
        if done.returncode != 0 and "omp" in done.stderr.lower():
            # a compiler without OpenMP: the quantized linears run on one thread
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise NativeOpsError(f"{cc} failed to build {', '.join(p.name for p in sources)}: "
                                 f"{done.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent process loads either none or a whole library
    return target


def build_library(sources: tuple[Path, ...], headers: tuple[Path, ...]) -> "NativeOps":
    """The library built from ``sources`` (``headers`` join its cache key), loaded: this tree's ``SOURCES`` and
    ``HEADERS``, or another tree's ``kernels/cpu`` to time against. Raises NativeOpsError (or OSError) saying why
    not."""
    if platform.system() not in ("Linux", "Darwin"):
        raise NativeOpsError(f"native CPU ops are built on Linux and macOS only, not {platform.system()}")
    cc = _compiler()
    if cc is None:
        raise NativeOpsError("no C compiler found (set $CC or install gcc/clang)")
    library = ctypes.CDLL(str(_build(cc, sources, headers)))
    for name, argtypes in SIGNATURES.items():
        getattr(library, name).argtypes = argtypes
        getattr(library, name).restype = RESTYPES.get(name)
    return NativeOps(library)


def _load() -> "NativeOps":
    return build_library(SOURCES, HEADERS)


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
