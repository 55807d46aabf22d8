"""``latency --graphs``: the decode step (the time between tokens) eager and through the bucketed graph path, side by
side per placement and batch."""
from __future__ import annotations

import json
import os

from gh200rt.bench.decode_rate import placements, step_ms
from gh200rt.bench.rounds import alternate
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.loader.load import read_arch


def run_graphs(args) -> None:
    """Per placement and batch: the eager step time against the bucketed path's, best of three alternated rounds."""
    print(f"load average {os.getloadavg()[0]:.2f}; model {args.model}; dtype {args.dtype}")
    print(f"{'placement':<10} {'tiers (res/str/dir)':<20} {'batch':>5} {'bucket':>6} {'eager ms':>9} "
          f"{'graphs ms':>9} {'speed-up':>8} {'overhead ms':>11} {'captures':>8} {'pool MiB':>8}")
    layers = read_arch(args.model).num_layers
    rows = []
    for name in args.placements.split(","):
        engines = {}
        for graphs in (False, True):
            config = EngineConfig.from_kwargs(model=args.model, dtype=args.dtype, max_model_len=256,
                                              num_kv_blocks=256, host_weight_dtype=args.host_weight_dtype,
                                              enforce_eager=not graphs, **placements(layers)[name])
            engines[graphs] = LLMEngine.from_config(config)
        eager, bucketed = engines[False], engines[True]
        tiers = eager.stats().layers_per_tier
        label = f"{tiers.get('resident', 0)}/{tiers.get('streamed', 0)}/{tiers.get('direct', 0)}"
        for batch in map(int, args.batches.split(",")):
            for engine in engines.values():
                step_ms(engine, batch, 3)       # warm-up; captures this batch's bucket
            times = alternate({graphs: (lambda _round, engine=engine: step_ms(engine, batch, args.tokens))
                               for graphs, engine in engines.items()}, 3)
            t_eager, t_graphs = min(times[False]), min(times[True])
            graphs = bucketed.graphs
            bucket = min((b for b in graphs.buckets if b >= batch), default=batch)
            print(f"{name:<10} {label:<20} {batch:>5} {bucket:>6} {t_eager:>9.3f} {t_graphs:>9.3f} "
                  f"{t_eager / t_graphs:>7.2f}x {t_graphs - t_eager:>11.3f} {graphs.captures:>8} "
                  f"{graphs.pool_bytes / 2**20:>8.1f}", flush=True)
            rows.append(dict(placement=name, tiers=label, batch=batch, bucket=bucket, eager_ms=t_eager,
                             graphs_ms=t_graphs, speedup=t_eager / t_graphs, captures=graphs.captures,
                             graph_pool_bytes=graphs.pool_bytes, device=bucketed.runner.device))
        for engine in engines.values():
            engine.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.random_model or args.model, rows=rows), f, indent=1)
