"""`python -m gh200rt.bench latency --prefill` runs end to end (tiny cases) and prints a row per case."""
from pathlib import Path

from tests.zygote import run_python

ROOT = Path(__file__).resolve().parents[2]


def test_it_prints_a_row_per_case(short_smollm2):
    done = run_python(["-m", "gh200rt.bench", "latency", "--prefill", "--cases", "2x16,1x40",
                           "--rounds", "2", "--model", short_smollm2],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [row[:3] for row in rows] == [["2", "x", "16"], ["1", "x", "40"]], done.stdout
    assert all(float(row[4]) > 0 and len(row) == 7 for row in rows), done.stdout
