"""The worker ranks a process has started (``gh200rt.distributed.rank_process``), alive or zombie, found through
psutil: they are plain subprocesses, not multiprocessing children."""
from __future__ import annotations

import os

RANK_MODULE = "gh200rt.distributed.rank_process"


def rank_processes_of(pid: int | None = None) -> list:
    import psutil
    found = []
    for child in psutil.Process(pid or os.getpid()).children(recursive=True):
        try:
            if RANK_MODULE in child.cmdline():
                found.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found
