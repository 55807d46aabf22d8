"""The report of scripts/validate_gpu.py: one JSON and one Markdown file with every step (command, exit
code, seconds, output tail), the preflight checks, and each measured figure next to its roofline from
the platform profile gh200rt detected (HARDWARE.md figures, or a measured profile):

- pinned H2D copy GB/s (``bandwidth`` reader ``gpu-copy-h2d``) against the profile's ``link_h2d_gbps``;
- direct-read GB/s through host_gemm (``gpu-host-gemm``) against ``direct_read_gbps``;
- decode tokens/s per placement (``latency``) against the roofline ``latency`` computes from the same
  profile for the plan's bytes per step.

It also lists every failing gpu test with its first error line (the tests step's junit XML), each request
of the serve smoke test, the measured profile the bandwidth step wrote (and the flag that uses it), and
each step that skipped itself with its reason. Skipped steps do not fail the run.
"""
from __future__ import annotations

import json
from pathlib import Path

from junit_failures import failing_tests

READER_ROOFLINES = {"gpu-copy-h2d": ("pinned H2D copy", "link_h2d_gbps"),
                    "gpu-host-gemm": ("direct read through host_gemm", "direct_read_gbps")}


def _load(path: Path | None) -> dict | None:
    try:
        return json.loads(path.read_text()) if path is not None and path.is_file() else None
    except json.JSONDecodeError:
        return None


def bandwidth_figures(report: dict | None, platform: dict) -> list[dict]:
    """Largest buffer, local node, for each GPU reader: GB/s next to the profile's link figure."""
    figures = []
    for reader, (what, field) in READER_ROOFLINES.items():
        rows = [r for r in (report or {}).get("results", []) if r["reader"] == reader and r["placement"] == "local-bind"]
        if rows:
            row = max(rows, key=lambda r: r["bytes"])
            roof = platform.get(field)
            figures.append({"what": f"{what}, {row['bytes'] >> 20} MiB, local node", "measured": row["median_gbps"],
                            "unit": "GB/s", "roofline": roof, "roofline_source": f"profile {platform.get('profile')} "
                            f"{field}", "fraction": row["median_gbps"] / roof if roof else None})
    return figures


def decode_figures(report: dict | None) -> list[dict]:
    return [{"what": f"decode {report['model']}, {r['placement']}"
                     f"{'' if r.get('one_call_layers', True) else ' op by op'}"
                     f"{', fused up to %d rows' % r['fused_decode_rows'] if r.get('fused_decode_rows', 1) > 1 else ''}"
                     f"{', PDL' if r.get('pdl') else ''}"
                     f"{', async scheduling' if r.get('async_scheduling') else ''} ({r['tiers']} res/str/dir), "
                     f"batch {r['batch']}" + (f", {r['kernels_per_step']} kernels/step" if r.get("kernels_per_step")
                                              else ""),
             "measured": r["tokens_per_second"], "unit": "tok/s", "roofline": r["roofline_tokens_per_second"],
             "roofline_source": f"profile {report['platform']} bandwidths for the plan's bytes per step",
             "fraction": r["tokens_per_second"] / r["roofline_tokens_per_second"]}
            for r in (report or {}).get("rows", [])]


def kernel_figures(report: dict | None) -> list[dict]:
    """Rows of ``python -m gh200rt.bench kernel gpu-attention``, ``host-gemm`` and ``skinny``, each GB/s next to
    the bound that script measured in the same run."""
    report = report or {}
    figures = []
    for r in report.get("rows", []):
        if "gb_s" in r:      # a product: host_gemm's or the few-row sweep's
            roof = report["bounds_gb_s"][r["bound"]]
            figures.append({"what": f"product {r['layer']} M={r['m']} {r['weights']} read from {r['read_from']}, "
                                    f"{r['kernel']} kernel", "measured": r["gb_s"], "unit": "GB/s", "roofline": roof,
                            "roofline_source": f"{r['bound']} copy measured in the same run",
                            "fraction": r["gb_s"] / roof})
        elif "gbps" in r:    # paged attention
            figures.append({"what": f"paged attention batch {r['batch']}, context {r['context']}, {r['route']}",
                            "measured": r["gbps"], "unit": "GB/s", "roofline": report["copy_gbps"],
                            "roofline_source": "device-to-device copy measured in the same run",
                            "fraction": r["gbps"] / report["copy_gbps"]})
    return figures


def speculative_figures(report: dict | None) -> list[dict]:
    """``python -m gh200rt.bench speculative --json``: tok/s with speculation next to the same run's without."""
    engines = (report or {}).get("engines", {})
    off, on = engines.get("off"), engines.get("on") or engines.get("on-async")
    if not off or not on:
        return []
    figures = []
    for key, label in (("single_tok_s", "single stream"), ("batched_tok_s", f"batch {report.get('batch')}")):
        figures.append({"what": f"speculative decoding ({report.get('speculative_config')}), weights "
                                f"{report.get('offload')}, {label} (acceptance {on['acceptance']:.2f})",
                        "measured": on[key], "unit": "tok/s", "roofline": off[key],
                        "roofline_source": "the same tasks without speculation, same run",
                        "fraction": on[key] / off[key] if off[key] else 0.0})
    sync, on = engines.get("on-sync"), engines.get("on-async")
    if sync and on:
        for key, label in (("single_tok_s", "single stream"), ("batched_tok_s", f"batch {report.get('batch')}")):
            figures.append({"what": f"speculative decoding with async scheduling, weights {report.get('offload')}, "
                                    f"{label}", "measured": on[key], "unit": "tok/s", "roofline": sync[key],
                            "roofline_source": "the same speculation synchronous (--no-async-scheduling), same run",
                            "fraction": on[key] / sync[key] if sync[key] else 0.0})
    return figures


def collect_figures(results: list[dict], platform: dict) -> list[dict]:
    figures = []
    for r in results:
        for kind, path in r.get("outputs", {}).items():
            data = _load(Path(path))
            if kind == "bandwidth":
                figures += bandwidth_figures(data, platform)
            elif kind == "decode":
                figures += decode_figures(data)
            elif kind == "kernel":
                figures += kernel_figures(data)
            elif kind == "speculative":
                figures += speculative_figures(data)
    return figures


def collect_failing_tests(results: list[dict]) -> list[dict]:
    return [t for r in results if "junit" in r.get("outputs", {}) for t in failing_tests(r["outputs"]["junit"]) or []]


def profile_lines(results: list[dict], platform: dict) -> list[str]:
    """The measured profile the bandwidth step wrote, each figure next to the built-in one it replaces."""
    lines = []
    for r in results:
        path = r.get("outputs", {}).get("profile")
        data = _load(Path(path)) if path else None
        if data:
            lines += ["", "## Measured profile", "", f"`{path}` (over the built-in {data.get('base_profile')} "
                      f"profile); plan with it on this host: `--profile-file {path}`", ""]
            lines += [f"- {k}: {v} (built-in: {platform.get(k, 'n/a')})" for k, v in data.items()
                      if k.endswith(("_gbps", "_tflops"))]
    return lines


def serve_lines(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        data = _load(Path(r["outputs"]["serve"])) if "serve" in r.get("outputs", {}) else None
        if data:
            lines += ["", f"## Serve smoke test ({data.get('model')}, gh200rt from {data.get('gh200rt_from')})", ""]
            lines += [f"- {'ok' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}" for c in data["checks"]]
            lines.append(f"- server {data.get('server_stopped')}")
    return lines


def write_report(out: Path, device: dict, platform: dict, checks: list[dict], results: list[dict]) -> Path:
    figures = collect_figures(results, platform)
    failing = collect_failing_tests(results)
    ok = bool(results) and all(r["status"] in ("ok", "skipped") for r in results) and all(c["ok"] for c in checks)
    (out / "report.json").write_text(json.dumps({"ok": ok, "device": device, "platform": platform,
                                                 "preflight": checks, "steps": results, "figures": figures,
                                                 "failing_tests": failing}, indent=2))
    title = f"{device.get('device', 'GPU')} (capability {device.get('capability', '?')}), profile " \
            f"{platform.get('profile', '?')}"
    lines = [f"# GPU validation on {title}", "", f"Result: **{'all steps passed' if ok else 'FAILED'}**. "
             f"torch {device.get('torch')}, CUDA {device.get('torch_cuda')}, Python {device.get('python')}, "
             f"{device.get('machine')}.", "", "| step | status | seconds | cap |", "|---|---|---|---|"]
    lines += [f"| {r['step']} | {r['status']} | {r['seconds']} | {r['cap_s']} |" for r in results]
    lines += ["", "## Figures and their rooflines", "", "| what | measured | roofline | fraction | roofline from |",
              "|---|---|---|---|---|"]
    lines += [f"| {f['what']} | {f['measured']:.1f} {f['unit']} | "
              f"{f['roofline']:.1f} {f['unit']} | {f['fraction']:.2f} | {f['roofline_source']} |"
              if f["roofline"] else f"| {f['what']} | {f['measured']:.1f} {f['unit']} | n/a | n/a | |" for f in figures]
    if not figures:
        lines.append("| (no figures: the benchmark steps did not finish) | | | | |")
    if failing:
        lines += ["", f"## Failing tests ({len(failing)})", ""]
        lines += [f"- `{t['id']}`{' (error)' if t['kind'] == 'error' else ''}: {t['first_line']}" for t in failing]
    skipped = [r for r in results if r["status"] == "skipped"]
    if skipped:
        lines += ["", "## Skipped", ""] + [f"- {r['step']}: {r.get('note', '')}" for r in skipped]
    lines += profile_lines(results, platform) + serve_lines(results)
    lines += ["", "## Preflight", ""] + [f"- {'ok' if c['ok'] else 'FAIL'} `{c['name']}`: {c['detail']}"
                                         for c in checks]
    for r in results:
        if r["status"] == "skipped":
            continue
        lines += ["", f"## {r['step']}: {r['status']} (exit {r['exit_code']}, {r['seconds']} s)", "",
                  f"`{r['command']}`", "", "```", r["output_tail"].rstrip(), "```"]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
