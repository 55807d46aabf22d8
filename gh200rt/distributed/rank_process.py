"""A worker rank in a fresh interpreter: ``python -m gh200rt.distributed.rank_process``, its arguments pickled on
stdin, running ``worker.run_worker``.

Not multiprocessing's spawn: a spawned child imports the parent's ``__main__`` again before it runs anything, so a
plain script that builds ``LLM(..., tensor_parallel_size=2)`` at its top level (no ``if __name__ == "__main__":``)
makes every child start its own engine, and Python stops each with its bootstrapping error. A fork would copy rank
0's OpenMP pool and any CUDA context. This child imports gh200rt and what the pickled arguments name, nothing of the
parent's script: the same command works from a script, ``python -c``, a notebook or a server.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

# where ``-m`` finds gh200rt in the child, installed or not (sys.path is the parent's only once main() runs)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RankProcess:
    """The handle ``multiprocessing.Process`` gave: ``pid``, ``exitcode`` (negative: the signal that killed it),
    ``is_alive``, ``join``, ``kill``."""

    def __init__(self, rank: int, worker_args: tuple):
        """Start rank ``rank`` running ``run_worker(*worker_args)``; the child has this process's ``sys.path``
        (so what the arguments name unpickles there as here), environment and working directory."""
        self.rank = rank
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        self._popen = subprocess.Popen([sys.executable, "-m", __name__, f"--rank={rank}"], stdin=subprocess.PIPE,
                                       env=env, close_fds=True)
        try:
            self._popen.stdin.write(pickle.dumps(list(sys.path)) + pickle.dumps(worker_args))
            self._popen.stdin.close()
        except BaseException:
            self._popen.kill()
            self._popen.wait()
            raise

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()


def main() -> None:
    stdin = sys.stdin.buffer
    sys.path[:] = pickle.load(stdin)       # before the arguments: their classes may live on the parent's path
    worker_args = pickle.load(stdin)
    sys.stdin.close()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    from gh200rt.distributed.worker import run_worker
    run_worker(*worker_args)


if __name__ == "__main__":
    main()
