"""--baseline REV|DIR of the kernel benchmarks: another tree's kernels imported from a fresh package, in the
layout of today's tree (kernels/triton/<name>.py, importing neighbours by their gh200rt.kernels name, which
resolves to the baseline's) and of older ones
(kernels/<name>.py), a second load never reusing the first one's modules."""
import subprocess

import pytest

from gh200rt.bench import baseline


def write(folder, files):
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return str(folder)


def test_a_directory_in_the_triton_layout_imports_its_neighbours(tmp_path):
    folder = write(tmp_path / "kernels", {
        "__init__.py": "raise ImportError('the top __init__ is not run')\n",
        "packed_weight.py": "WHERE = 'top'\n",
        "triton/__init__.py": "",
        "triton/host_gemm.py": "from ..packed_weight import WHERE\nfrom .tiles import TILE\n",
        "triton/gemv.py": "from gh200rt.kernels.triton.tiles import TILE\n",
        "triton/tiles.py": "TILE = 16\n"})
    package = baseline.kernels_package(folder)
    module = baseline.kernel_module(package, "host_gemm")
    assert (module.WHERE, module.TILE) == ("top", 16)
    assert baseline.kernel_module(package, "gemv").TILE == 16    # the baseline's neighbour, not this tree's
    assert baseline.holds_kernels(tmp_path / "kernels", ("host_gemm", "packed_weight"))
    assert not baseline.holds_kernels(tmp_path / "kernels", ("paged_attention",))


def test_a_directory_in_the_old_layout_and_two_loads_apart(tmp_path):
    old = write(tmp_path / "old", {"quant.py": "VERSION = 1\n", "host_gemm.py": "from .quant import VERSION\n"})
    new = write(tmp_path / "new", {"quant.py": "VERSION = 2\n", "host_gemm.py": "from .quant import VERSION\n"})
    assert baseline.kernel_module(baseline.kernels_package(old), "host_gemm").VERSION == 1
    assert baseline.kernel_module(baseline.kernels_package(new), "host_gemm").VERSION == 2
    with pytest.raises(SystemExit, match="no kernels/triton/gemv.py or kernels/gemv.py"):
        baseline.kernel_module(baseline.kernels_package(old), "gemv")


def test_a_git_revision_is_read_with_git_show():
    head = subprocess.run(["git", "-C", str(baseline.CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "-C", str(baseline.CHECKOUT), "ls-tree", "-r", "--name-only", "HEAD", "kernels/"],
                            capture_output=True, text=True).stdout.split()
    assert any(p.endswith("/pdl.py") for p in listed), listed
    package = baseline.kernels_package("HEAD")
    module = baseline.kernel_module(package, "pdl")
    assert module.__name__.startswith("kernels_baseline_") and module.__file__.endswith("pdl.py")
    assert baseline.weight_formats(package).__name__ in ("gh200rt.formats.pack", f"{package}.quant")


def test_an_unknown_revision_says_so():
    with pytest.raises(SystemExit, match="--baseline no-such-rev: cannot list kernels/"):
        baseline.kernels_package("no-such-rev")
