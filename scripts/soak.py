"""Soak: a mixed load for a while, then proof that the server let go of everything (issue 27).

    python scripts/soak.py                                  # 10 minutes on the default server (SmolLM2, CPU)
    python scripts/soak.py --duration 60 --concurrency 8 --json soak.json
    python scripts/soak.py --url http://127.0.0.1:8000     # a server already running
    python scripts/soak.py --duration 10 --server-args "--model DIR --max-model-len 512"

Without --url it starts ``python -m gh200rt.serve`` from this checkout on a free port (--server-args
are passed on; none: the default server) and stops it at the end. --concurrency clients each loop
over the kinds of scripts/soak_load.py (plain and streamed, chat and completions, aborts,
disconnects, structured outputs, seeded repeats, n=2) until --duration has passed. Every
--sample-interval seconds it reads /metrics: the server's RSS, KV blocks in use, running / waiting
sequences, admitted sequences, pending requests and asyncio tasks.

At the end the load stops, the server gets --settle seconds to drain, and the run passes when: no
request failed or was refused; every seeded repeat gave the same text; every finished structured
answer matched its schema; no KV block is in use, nothing runs, waits, is admitted or pending; the
event loop has no more tasks than when idle before the load; the median RSS of the last third of
the samples after --warmup is within --rss-tolerance of the first third's; /health answers 200.
It prints each figure next to its bound and exits 1 when any bound is missed.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from scripts.serve_smoke import free_port, stop, wait_healthy  # noqa: E402
from scripts.soak_load import KINDS, OffSchema, SeedMismatch, Tally, client_loop, send_one  # noqa: E402

GAUGES = {"rss": "process_resident_memory_bytes", "kv_used": "gh200rt_kv_blocks_used",
          "running": "gh200rt_num_requests_running", "waiting": "gh200rt_num_requests_waiting",
          "admitted": "gh200rt_admitted_sequences", "pending": "gh200rt_num_requests_pending",
          "tasks": "gh200rt_server_tasks", "preemptions": "gh200rt_num_preemptions_total"}
DRAINED = ("kv_used", "running", "waiting", "admitted", "pending")


@dataclass
class Sample:
    t: float
    rss: float
    kv_used: float
    running: float
    waiting: float
    admitted: float
    pending: float
    tasks: float
    preemptions: float


async def scrape(client: httpx.AsyncClient, t0: float) -> Sample:
    text = (await client.get("/metrics")).text
    values = {}
    for key, name in GAUGES.items():
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        if found is None:
            raise RuntimeError(f"/metrics has no {name}: is this a gh200rt server with the soak gauges?")
        values[key] = float(found.group(1))
    return Sample(time.monotonic() - t0, **values)


async def sample_until(client, t0: float, deadline: float, interval: float, samples: list[Sample]) -> None:
    next_print = t0 + 60
    while time.monotonic() < deadline:
        samples.append(await scrape(client, t0))
        if time.monotonic() >= next_print:
            s = samples[-1]
            print(f"  {s.t:6.0f} s  RSS {s.rss / 2**20:7.1f} MiB  KV blocks {s.kv_used:5.0f}  running {s.running:3.0f}"
                  f"  waiting {s.waiting:3.0f}  tasks {s.tasks:3.0f}", flush=True)
            next_print += 60
        await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))


async def settle(client, t0: float, timeout: float) -> Sample:
    """The first sample with nothing left in the server, or the last one after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        s = await scrape(client, t0)
        if not any(getattr(s, k) for k in DRAINED) or time.monotonic() > deadline:
            return s
        await asyncio.sleep(0.25)


def rss_drift(samples: list[Sample], warmup: float) -> tuple[float, float, float] | None:
    """(first-third median, last-third median, relative drift) of the samples after ``warmup``."""
    steady = [s.rss for s in samples if s.t >= warmup]
    if len(steady) < 6:
        return None
    third = len(steady) // 3
    first, last = statistics.median(steady[:third]), statistics.median(steady[-third:])
    return first, last, (last - first) / first


async def soak(args, url: str) -> dict:
    t0 = time.monotonic()
    tallies = {name: Tally() for name in KINDS}
    timeout = httpx.Timeout(300.0, connect=30.0)
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=30) as probe, \
            httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        rng = random.Random(args.seed)
        for name in KINDS:                                    # warm-up: every kind once, then the idle baseline
            await send_one(client, rng, name, tallies[name])
        idle = await settle(probe, t0, args.settle)
        print(f"idle after warm-up: RSS {idle.rss / 2**20:.1f} MiB, {idle.tasks:.0f} tasks; "
              f"load for {args.duration:.0f} s with {args.concurrency} clients", flush=True)
        start = time.monotonic()
        deadline = start + args.duration
        samples: list[Sample] = []
        await asyncio.gather(sample_until(probe, start, deadline, args.sample_interval, samples),
                             *(client_loop(client, args.seed * 1000 + i, deadline, tallies)
                               for i in range(args.concurrency)))
        load_s = time.monotonic() - start
        end = await settle(probe, start, args.settle)
        health = (await probe.get("/health")).status_code
    return {"tallies": tallies, "samples": samples, "idle": idle, "end": end, "health": health, "load_s": load_s}


def verdict(args, run: dict) -> list[tuple[str, str, str, bool]]:
    """(figure, value, bound, met) rows."""
    tallies, end, idle, samples = run["tallies"], run["end"], run["idle"], run["samples"]
    total = sum(t.sent for t in tallies.values())
    failed, refused = sum(t.failed for t in tallies.values()), sum(t.refused for t in tallies.values())
    mismatched = tallies["seeded"].reasons.get(SeedMismatch.reason, 0)
    bad_json = tallies["structured"].reasons.get(OffSchema.reason, 0)
    rows = [("requests sent (all kinds)", f"{total} in {run['load_s']:.0f} s", "", True),
            ("failed requests", str(failed), "0", failed == 0),
            ("refused with 503", str(refused), "0 (the load stays under the limit)", refused == 0),
            ("seeded repeats that differed", f"{mismatched} of {tallies['seeded'].sent}", "0", mismatched == 0),
            ("finished structured answers off-schema", f"{bad_json} of {tallies['structured'].ok + bad_json}", "0",
             bad_json == 0)]
    for key in DRAINED:
        peak = max((getattr(s, key) for s in samples), default=0)
        rows.append((f"{key} at the end (peak {peak:.0f})", f"{getattr(end, key):.0f}", "0", getattr(end, key) == 0))
    rows.append(("asyncio tasks at the end", f"{end.tasks:.0f}", f"<= {idle.tasks:.0f} (idle before the load)",
                 end.tasks <= idle.tasks))
    drift = rss_drift(samples, args.warmup)
    if drift is None:
        rows.append(("RSS flat", "too few samples", f">= 6 after {args.warmup:.0f} s", False))
    else:
        first, last, rel = drift
        rows.append((f"RSS, last third vs first third after {args.warmup:.0f} s",
                     f"{last / 2**20:.1f} vs {first / 2**20:.1f} MiB ({rel:+.1%})",
                     f"<= {args.rss_tolerance:+.0%}", rel <= args.rss_tolerance))
    rows.append(("RSS idle before / at the end / max", f"{idle.rss / 2**20:.1f} / {end.rss / 2**20:.1f} / "
                 f"{max(s.rss for s in samples) / 2**20:.1f} MiB" if samples else "-", "", True))
    rows.append(("preemptions during the load", f"{end.preemptions - idle.preemptions:.0f}", "", True))
    rows.append(("/health at the end", str(run["health"]), "200", run["health"] == 200))
    return rows


def report(run: dict, rows) -> None:
    print("\nkind        sent      ok    left  unfinished  refused  failed")
    for name, t in run["tallies"].items():
        print(f"{name:<10} {t.sent:5d} {t.ok:7d} {t.left:7d} {t.unfinished:11d} {t.refused:8d} {t.failed:7d}")
        for error in t.errors:
            print(f"    {error}")
    width = max(len(r[0]) for r in rows)
    print(f"\n{'figure':<{width}}  {'value':<34} {'bound':<36} met")
    for figure, value, bound, met in rows:
        print(f"{figure:<{width}}  {value:<34} {bound:<36} {'yes' if met else 'NO'}")


def start_server(args) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="gh200rt-soak-", suffix=".log")[1])
    argv = [sys.executable, "-m", args.server_module, "--port", str(port), "--log-level", "warning",
            *shlex.split(args.server_args)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(f"server pid {proc.pid}: {' '.join(argv[1:])}; log {log_path}", flush=True)
    return proc, f"http://127.0.0.1:{port}", log_path


class ServerStartFailed(RuntimeError):
    """The started server never became healthy; the message holds the reason and its log's tail."""


@contextlib.contextmanager
def served(args):
    """The URL a run loads: ``--url``, or a server started from this checkout, healthy, stopped on leaving."""
    if args.url:
        yield args.url.rstrip("/")
        return
    proc, url, log_path = start_server(args)
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            unhealthy = wait_healthy(client, proc, args.load_timeout)
        if unhealthy:
            raise ServerStartFailed(f"{unhealthy}\n{log_path.read_text()[-3000:]}")
        yield url
    finally:
        print(f"server: {stop(proc, 30.0)}", flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (default: start one from this checkout)")
    p.add_argument("--server-module", default="gh200rt.serve", help="the module the started server runs")
    p.add_argument("--server-args", default="", help="flags for the started server (one string)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--concurrency", type=int, default=8, help="clients sending at once")
    p.add_argument("--seed", type=int, default=0, help="seed of the clients' choices")
    p.add_argument("--sample-interval", type=float, default=5.0, help="seconds between /metrics samples")
    p.add_argument("--warmup", type=float, help="seconds of load before RSS counts (default: a fifth of "
                                                "--duration, at most 60)")
    p.add_argument("--rss-tolerance", type=float, default=0.05, help="RSS drift allowed, as a fraction")
    p.add_argument("--settle", type=float, default=60.0, help="seconds the server gets to drain at the end")
    p.add_argument("--load-timeout", type=float, default=600.0, help="seconds for a started server to be healthy")
    p.add_argument("--json", type=Path, help="also write the figures and every sample here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.warmup = min(args.duration / 5, 60.0) if args.warmup is None else args.warmup
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a SIGTERM still stops the server (served's finally)
    try:
        with served(args) as url:
            run = asyncio.run(soak(args, url))
    except ServerStartFailed as err:
        print(f"FAIL start: {err}")
        return 1
    rows = verdict(args, run)
    report(run, rows)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": rows, "tallies": {k: asdict(t) for k, t in run["tallies"].items()},
                                         "samples": [asdict(s) for s in run["samples"]]}, indent=1))
    ok = all(met for *_, met in rows)
    print("soak: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
