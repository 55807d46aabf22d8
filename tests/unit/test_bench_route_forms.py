"""``bench kernel route-forms``: each route this machine runs prints its form one by one and side by side, with the
whole model's seconds and the gain; a route it cannot run is named with the reason."""
import re

from gh200rt.backends.cpu.routes import ROUTES, route_unavailable
from gh200rt.bench.__main__ import main

ROW = re.compile(r"^(\w+)\s+(\S+)\s+(one by one|side by side, 2 threads)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$")


def test_it_times_every_route_one_by_one_and_side_by_side(capsys):
    assert main(["kernel", "route-forms", "--shape", "llama3-tiny", "--workers", "2", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    rows = [ROW.match(line).groups() for line in out.splitlines() if ROW.match(line)]
    for route in ROUTES:
        why_not = route_unavailable(route)
        if why_not is not None:
            assert f"{route:<6} skipped: {why_not}" in out
            continue
        ways = {way: (float(ms), float(gain)) for name, _, way, ms, _, gain in rows if name == route}
        assert set(ways) == {"one by one", "side by side, 2 threads"}, out
        assert ways["one by one"][1] == 1.0 and all(ms > 0 for ms, _ in ways.values())
