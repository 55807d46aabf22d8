"""``python -m gh200rt.bench <subcommand> ...``: every benchmark of gh200rt, each figure next to its baseline or
limit measured in the same run (docs/BENCHMARKS.md records them with their commands).

``python -m gh200rt.bench <subcommand> --help`` describes one; ``kernel`` and ``ab`` list their own names."""
from __future__ import annotations

import sys

from gh200rt.bench.commands import Command, default_prog, dispatch

COMMANDS = {
    "kernel": Command("gh200rt.bench.kernel", "one kernel or op timed against its bound or baseline"),
    "ab": Command("gh200rt.bench.ab", "a path switched off and on in alternate rounds of one process"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(sys.argv[1:] if argv is None else argv, COMMANDS, default_prog(), __doc__)


if __name__ == "__main__":
    sys.exit(main())
