"""`python -m gh200rt.bench tiers` on a random checkpoint of a published shape (the validation kit runs it on the
Llama-3-8B shape with CUDA graphs): each engine's row counts its tier moves and graph captures, and
--require-moves fails a trace that moved nothing."""
import json
from pathlib import Path

from tests.zygote import run_python

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--engines", "dynamic", "--quiet-seconds", "1", "--burst-requests", "6", "--burst-seconds", "0.5",
         "--quiet-tokens", "4", "--burst-tokens", "8"]


def run(tmp_path, *extra):
    return run_python(["-m", "gh200rt.bench", "tiers", "--random-model", "llama3-tiny",
                           "--random-model-dir", str(tmp_path / "m"), *SHORT, *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_random_model_trace_counts_tier_moves_and_graph_captures(tmp_path):
    proc = run(tmp_path, "--json", str(tmp_path / "dynamic.json"), "--rounds", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "dynamic.json").read_text())["rows"]
    assert [(r["engine"], r["round"]) for r in rows] == [("dynamic", 1), ("dynamic", 2)]
    for row in rows:
        assert set(row["moves"]) >= {"promote", "demote"}
        assert row["graph_captures"] == 0, "the CPU runs eagerly by default: nothing is captured"
        assert len(row["latencies"]) == row["requests"] and row["kv_pool_mib"] > 0
        met = sum(1 for ttft, tpot in row["latencies"] if ttft <= 5.0 and (tpot is None or tpot <= 0.5))
        assert met == row["slo_met"], "each request's latencies give the SLO count again"
    assert "graph captures 0" in proc.stdout and "random llama3-tiny weights" in proc.stdout
    assert "round 2 of 2" in proc.stdout and "KV pool" in proc.stdout


def test_require_moves_fails_a_trace_that_moved_nothing(tmp_path):
    proc = run(tmp_path, "--require-moves", "--budget-kv-blocks", "4096")   # the burst fits: nothing moves
    assert proc.returncode == 1 and "made no tier move" in proc.stderr


def test_static_splits_stream_n_layers_spread_evenly_and_unknown_engines_are_refused():
    import pytest

    from gh200rt.bench.tiers import static_split
    assert static_split("dynamic", 32) is None and static_split("resident", 32) is None
    layers = [int(part.split(":")[0]) for part in static_split("static-8", 32).split(",")]
    assert len(layers) == 8 and all(part.endswith(":streamed") for part in static_split("static-8", 32).split(","))
    assert layers == sorted(layers) and max(b - a for a, b in zip(layers, layers[1:])) == 4
    for bad in ("static-0", "static-33", "static-x", "halfway"):
        with pytest.raises(ValueError, match="static-N"):
            static_split(bad, 32)


def test_bursts_repeat_the_burst_and_its_quiet_phase():
    import argparse

    from gh200rt.bench.tiers import make_trace
    args = argparse.Namespace(seed=0, quiet_seconds=4.0, quiet_rate=2.0, quiet_prompt=8, quiet_tokens=2,
                              burst_requests=5, burst_seconds=1.0, burst_prompt=20, burst_tokens=3, bursts=1)
    one = make_trace(args, 100)
    args.bursts = 3
    three = make_trace(args, 100)
    assert [(r.arrival, r.prompt) for r in three[:len(one)]] == [(r.arrival, r.prompt) for r in one]
    bursts = [r.arrival for r in three if len(r.prompt) == 20]
    assert len(bursts) == 15 and len([r for r in one if len(r.prompt) == 20]) == 5
    for i in range(3):               # burst i arrives within its second, after i quiet phases and i bursts
        start = 4.0 + i * 5.0
        assert sum(start <= t <= start + 1.0 for t in bursts) == 5
    assert three[-1].arrival <= 4.0 + 3 * 5.0
