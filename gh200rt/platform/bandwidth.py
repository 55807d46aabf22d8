"""Measured bandwidth profiles: what a GPU host really moves, written by a benchmark, read by the planner.

Contract: ``profile_from_bandwidth_report(report, ...)`` turns the JSON of ``python -m gh200rt.bench
bandwidth`` (its GPU readers) into a measured profile; ``write_measured_profile(path, profile)`` writes it; the
planner reads it through ``--profile-file`` (``MemoryConfig.profile_file``) with
``load_measured_profile(path, base)``, which overrides the built-in profile ``base`` figure by figure and
records where the figures came from (``HardwareProfile.source``, printed by ``Plan.explain()``).
``scripts/validate_gpu.py`` writes one per host in its bandwidth step.

A measured profile is a JSON object::

    {"base_profile": "h100-sxm", "device_name": "NVIDIA H100 80GB HBM3",
     "measured_by": "python -m gh200rt.bench bandwidth ...", "measured_at": "2026-11-25T22:55:17+00:00",
     "link_h2d_gbps": 55.2, "direct_read_gbps": 51.0}

Figures are GB/s (1 GB = 1e9 bytes; ``peak_tflops`` and ``host_cpu_tflops`` in TFLOP/s); the other fields are
optional. A file
that names its ``base_profile`` is refused on a host whose profile differs (an H100's PCIe figures would
mislead a GH200's planner). Every problem is a ``ProfileFileError`` naming the file and what is wrong.
"""
from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path

from gh200rt.platform.profiles import HardwareProfile

FIGURES = ("link_h2d_gbps", "direct_read_gbps", "hbm_gbps", "peak_tflops", "host_cpu_gbps", "host_cpu_tflops")
NOTES = ("base_profile", "device_name", "measured_by", "measured_at")
# bandwidth reader -> the figure it measures: the copy engine's pinned H2D, host_gemm reading in place
READER_FIGURES = {"gpu-copy-h2d": "link_h2d_gbps", "gpu-host-gemm": "direct_read_gbps", "cpu-linear": "host_cpu_gbps",
                  "cpu-gemm": "host_cpu_tflops"}
# a reader's GB/s -> its figure: cpu-gemm multiplies 64 rows by a bf16 weight, 64 flops per weight byte
# (1 TFLOP = 1000 GB)
READER_SCALE = {"cpu-gemm": 64 / 1000}
MEASURED_PLACEMENT = "local-bind"  # host memory on the GPU's own NUMA node, where gh200rt puts its slabs
FIGURE_NAMES = {"link_h2d_gbps": "host->device copy", "direct_read_gbps": "direct read", "hbm_gbps": "HBM",
                "peak_tflops": "peak compute", "host_cpu_gbps": "host cores reading weights",
                "host_cpu_tflops": "host cores computing"}


class ProfileFileError(ValueError):
    """A measured profile file that cannot be used: the message names the file and the problem."""


def _fix(path: str | Path) -> str:
    return (f"write one on the host with `python -m gh200rt.bench bandwidth --readers gpu-copy-h2d,gpu-host-gemm "
            f"--profile-out {path}` (scripts/validate_gpu.py does), or leave out --profile-file")


def read_profile_file(path: str | Path) -> dict:
    """The file's fields, checked: a JSON object of known fields, figures positive numbers, notes strings."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ProfileFileError(f"profile file {path} does not exist; {_fix(path)}") from None
    except OSError as err:
        raise ProfileFileError(f"profile file {path} cannot be read: {err.strerror or err}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileFileError(f"profile file {path} is not valid JSON (line {err.lineno}, column {err.colno}: "
                               f"{err.msg}); {_fix(path)}") from None
    if not isinstance(data, dict):
        raise ProfileFileError(f"profile file {path} holds a JSON {type(data).__name__}, not an object of figures "
                               f"such as {{\"link_h2d_gbps\": 55.2}}")
    unknown = sorted(set(data) - set(FIGURES) - set(NOTES))
    if unknown:
        raise ProfileFileError(f"profile file {path}: unknown field(s) {unknown}; known figures: "
                               f"{', '.join(FIGURES)}; notes: {', '.join(NOTES)}")
    for name in FIGURES:
        value = data.get(name)
        if name in data and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
                             or value == float("inf")):
            raise ProfileFileError(f"profile file {path}: {name} must be a positive number (GB/s, or TFLOP/s for "
                                   f"the _tflops figures), got {value!r}")
    for name in NOTES:
        if name in data and not isinstance(data[name], str):
            raise ProfileFileError(f"profile file {path}: {name} must be a string, got {data[name]!r}")
    if not any(name in data for name in FIGURES):
        raise ProfileFileError(f"profile file {path} holds no figure (one of {', '.join(FIGURES)}); {_fix(path)}")
    return data


def load_measured_profile(path: str | Path, base: HardwareProfile) -> HardwareProfile:
    """``base`` with the figures the file measured, and a ``source`` that says which came from where."""
    data = read_profile_file(path)
    measured_on = data.get("base_profile")
    if measured_on is not None and measured_on != base.name:
        device = f" ({data['device_name']})" if "device_name" in data else ""
        raise ProfileFileError(f"profile file {path} was measured on a {measured_on} host{device}, but this run's "
                               f"profile is {base.name}: its figures would mislead the planner here; measure this "
                               f"host, or pass --platform {measured_on} to plan for that one")
    figures = {name: float(data[name]) for name in FIGURES if name in data}
    where = ", ".join(f"{data[k]}" for k in ("device_name", "measured_at") if k in data)
    source = (f"{', '.join(FIGURE_NAMES[n] for n in figures)} measured in {path}" + (f" ({where})" if where else "")
              + (f"; the rest from the built-in {base.name} table" if len(figures) < len(FIGURES) else ""))
    return dataclasses.replace(base, **figures, source=source)


def profile_from_bandwidth_report(report: dict, base_profile: str, device_name: str, measured_by: str) -> dict:
    """A measured profile from ``bandwidth``'s JSON (numa_placement.json): per GPU or cpu-linear/-gemm reader, its
    largest buffer on the GPU's node.

    Figures a report lacks (a reader not run) are left out, so the built-in table keeps them."""
    profile = {"base_profile": base_profile, "device_name": device_name, "measured_by": measured_by,
               "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    for reader, figure in READER_FIGURES.items():
        rows = [r for r in report.get("results", []) if r["reader"] == reader and r["placement"] == MEASURED_PLACEMENT]
        if rows:
            profile[figure] = round(max(rows, key=lambda r: r["bytes"])["median_gbps"] * READER_SCALE.get(reader, 1), 2)
    return profile


def write_measured_profile(path: str | Path, profile: dict) -> Path:
    """Write ``profile`` as JSON; it is read back (checked) first, so no file the planner would refuse is written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(profile, indent=1) + "\n")
    try:
        read_profile_file(tmp)
    except ProfileFileError:
        tmp.unlink()
        raise
    tmp.replace(path)
    return path
