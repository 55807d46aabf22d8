"""The kernel harness (harness.c beside this file) built with the native library's sources and flags for four
targets, run, and its output read back: aarch64 with Grace's ISA (the NEON paths) and aarch64 portable, both run
under qemu-aarch64 at Grace's vector length, and x86-64 portable and x86-64-v3 (AVX2), run here."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gh200rt.backends.cpu import native

HARNESS = Path(__file__).with_name("harness.c")
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")
# -cpu max has SVE2, BF16 and I8MM; sve-max-vq=1 holds SVE to Grace's (Neoverse V2's) 128-bit vectors
QEMU_CPU = ("-cpu", "max,sve-max-vq=1")
# GCC 13+ knows Neoverse V2; GCC 12 takes its architecture
GRACE_CPUS = (("-mcpu=neoverse-v2",), ("-march=armv9-a+sve2+bf16+i8mm",))
# no __ARM_NEON, so every #else branch compiles. Not -march=armv8-a+nosimd: GCC 12 emits a SIMD instruction
# (umov) for kv_store.c under it, which the assembler then rejects.
ARM_PORTABLE = ("-march=armv8-a", "-U__ARM_NEON")
INSTALL_HINT = ("install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user (make install-test does where "
                "apt-get runs as root)")

KINDS = {"f32": 4, "u16": 2, "u8": 1, "i32": 4}


@dataclass(frozen=True)
class Build:
    name: str
    cc: str
    arch_flags: tuple[str, ...]
    emulated: bool

    def command(self, target: Path, openmp: bool) -> list[str]:
        flags = [f for f in native.FLAGS if f not in ("-march=native", "-shared", "-fPIC")]
        return [self.cc, *flags, *self.arch_flags, *(native.OPENMP if openmp else ()), f"-I{native.C_SOURCE_DIR}",
                "-o", str(target), str(HARNESS), *map(str, native.SOURCES), "-lm"]


@dataclass(frozen=True)
class Outputs:
    build: Build
    openmp: bool
    records: dict[str, tuple[str, bytes]]   # name -> (kind, raw bytes)


def missing_tools() -> str | None:
    """Why the aarch64 builds cannot be made and run here (None: they can)."""
    missing = [tool for tool in (CROSS_CC, QEMU) if shutil.which(tool) is None]
    if missing:
        return f"no {' or '.join(missing)} on PATH"
    if not (SYSROOT / "lib").is_dir():
        return f"no aarch64 C library at {SYSROOT}"
    return None


def grace_flags(workdir: Path) -> tuple[str, ...]:
    """The first of GRACE_CPUS the cross compiler takes."""
    probe = workdir / "probe.c"
    probe.write_text("int probe;\n")
    for flags in GRACE_CPUS:
        done = subprocess.run([CROSS_CC, *flags, "-c", "-o", str(workdir / "probe.o"), str(probe)],
                              capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            return flags
    raise RuntimeError(f"{CROSS_CC} takes none of {GRACE_CPUS}: {done.stderr.strip()[-500:]}")


def builds(workdir: Path) -> list[Build]:
    cc = native._compiler() or "cc"
    return [Build("aarch64-grace", CROSS_CC, grace_flags(workdir), True),
            Build("aarch64-portable", CROSS_CC, ARM_PORTABLE, True),
            Build("x86-64-v3", cc, ("-march=x86-64-v3",), False),
            Build("x86-64", cc, ("-march=x86-64",), False)]


def parse(text: str) -> dict[str, tuple[str, bytes]]:
    records = {}
    for line in text.splitlines():
        name, kind, count, data = line.split(" ")
        raw = bytes.fromhex(data)
        assert len(raw) == int(count) * KINDS[kind], f"{name}: {len(raw)} bytes for {count} x {kind}"
        records[name] = (kind, raw)
    return records


def cached_binary(build: Build, openmp: bool) -> Path:
    """Where the harness built for ``build`` is kept between runs: beside the native library's builds, under a name
    that hashes the harness, the kernels' sources and headers, the command (less the checkout's paths) and the
    compiler's version (as native.py names the library)."""
    version = subprocess.run([build.cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    sources = b"\0".join(path.read_bytes() for path in (HARNESS, *native.SOURCES, *native.HEADERS))
    # the checkout's paths out of the key: a fresh clone elsewhere finds the same build
    command = " ".join(build.command(Path("harness"), openmp)).replace(str(native.C_SOURCE_DIR), "<kernels>") \
        .replace(str(HARNESS.parent), "<harness>").encode()
    key = hashlib.sha256(b"\0".join([sources, command, version.encode()])).hexdigest()[:16]
    cache = Path(os.environ.get("GH200RT_CACHE_DIR") or Path.home() / ".cache" / "gh200rt") / "harness"
    return cache / f"{build.name}-{'omp' if openmp else 'no-omp'}-{key}"


def compile_harness(build: Build, workdir: Path) -> tuple[Path, bool]:
    """The harness built for ``build`` (a cached build when one exists), and whether with OpenMP: a compiler without
    OpenMP for the target builds without it, as native.py's build does."""
    for openmp in (True, False):
        cached = cached_binary(build, openmp)
        if cached.exists():
            return cached, openmp
    target = workdir / build.name
    openmp = True
    done = subprocess.run(build.command(target, True), capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "omp" in done.stderr.lower():
        openmp = False
        done = subprocess.run(build.command(target, False), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"building the harness for {build.name} failed: {done.stderr.strip()[-2000:]}")
    cached = cached_binary(build, openmp)
    cached.parent.mkdir(parents=True, exist_ok=True)
    kept = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    shutil.copy2(target, kept)
    os.replace(kept, cached)        # atomic: another run finds the whole binary or none
    return cached, openmp


def build_and_run(build: Build, workdir: Path, run_here: bool = True) -> Outputs | None:
    """The harness's outputs under `build` (None when it is not to be run here; outputs.openmp says whether it was
    built with OpenMP)."""
    target, openmp = compile_harness(build, workdir)
    if not run_here:
        return None
    command = [QEMU, *QEMU_CPU, "-L", str(SYSROOT), str(target)] if build.emulated else [str(target)]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if ran.returncode != 0:
        raise RuntimeError(f"the {build.name} harness exited with {ran.returncode}: {ran.stderr.strip()[-2000:]}")
    return Outputs(build, openmp, parse(ran.stdout))


def all_outputs(workdir: Path, runs_here) -> dict[str, Outputs | None]:
    """Every build's outputs, built and run two at a time; runs_here(build) says whether a native build's CPU is
    this one's (an x86-64-v3 binary needs AVX2)."""
    todo = builds(workdir)
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = pool.map(lambda b: build_and_run(b, workdir, b.emulated or runs_here(b)), todo)
        return {b.name: out for b, out in zip(todo, done)}
