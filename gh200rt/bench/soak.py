"""``stress``: a soak, a mixed load for a while, then proof that the server let go of everything (issue 27); the
bounds it holds the server to are ``stress``'s (``verdict``)."""
from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass

import httpx

from gh200rt.bench.server import ServerStartFailed, served
from gh200rt.bench.soak_load import KINDS, OffSchema, SeedMismatch, Tally, client_loop, send_one

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


def run_soak(args) -> int:
    args.warmup = min(args.duration / 5, 60.0) if args.warmup is None else args.warmup
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
