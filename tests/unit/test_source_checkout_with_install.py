"""A source checkout first on sys.path (pytest's pythonpath, scripts run from the checkout) next to a
regular, non-editable install of gh200rt: gh200rt.numa and gh200rt.kernels, which setuptools installs
from the top-level numa/ and kernels/ folders, are still found (the GPU host's validate_gpu.py setup)."""
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
sys.path[:0] = sys.argv[1:]
import gh200rt.numa, gh200rt.kernels, gh200rt.config
print(gh200rt.numa.__file__); print(gh200rt.kernels.__file__); print(gh200rt.config.__file__)
"""


def test_installed_numa_and_kernels_are_found_behind_a_checkout(tmp_path):
    installed = tmp_path / "site-packages"
    for package in ("gh200rt", "gh200rt/numa", "gh200rt/kernels"):  # the installed layout, as stubs
        (installed / package).mkdir(parents=True)
        (installed / package / "__init__.py").write_text("")
    # -S: no editable-install finder (its .pth is not read); this environment's packages (what gh200rt itself
    # imports) come after the checkout and the stub install, as site-packages would
    proc = subprocess.run([sys.executable, "-S", "-c", PROBE, str(ROOT), str(installed), *site.getsitepackages()],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    numa, kernels, config = proc.stdout.split()
    assert numa == str(installed / "gh200rt" / "numa" / "__init__.py")
    assert kernels == str(installed / "gh200rt" / "kernels" / "__init__.py")
    assert config == str(ROOT / "gh200rt" / "config" / "__init__.py"), "the checkout's own modules come first"
