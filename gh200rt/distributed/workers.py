"""Rank 0's handle on its N-1 worker processes: spawn them, wait until each has loaded its shard, connect the
process groups, send steps, say which rank failed and why, and stop them all.

The rendezvous is a ``TCPStore`` that rank 0 hosts on a free port (bound to port 0) on 127.0.0.1: one host. A
worker that fails writes its error to the store (``worker.py``); one that dies is seen by its exit code. Rank 0
polls both while waiting for the workers to load, and after any failed step, so a failure is reported within
seconds, never a hang.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from gh200rt.distributed.errors import TensorParallelError
from gh200rt.distributed.hosts import Rendezvous, rendezvous
from gh200rt.distributed.parallel_state import ParallelState, agreed_draft_booking, smallest_across_ranks
from gh200rt.distributed.sharding import TensorShard
from gh200rt.distributed.step_channel import send_step, send_stop
from gh200rt.distributed.rank_process import RankProcess
from gh200rt.engine.model_runner import HostStep
from gh200rt.speculative.booking import DraftBooking

POLL_SECONDS = 0.05
START_SECONDS = 900          # loading a large shard from a slow disk
FAILURE_GRACE_SECONDS = 5    # after a failed collective, how long a failing worker has to exit or report
STOP_SECONDS = 10


class TensorParallelWorkers:
    def __init__(self, config, arch, threads: int, timeout: timedelta, restore_threads: int | None = None,
                 restore_cpus: set[int] | None = None, meet: Rendezvous | None = None):
        """``threads``: torch threads per worker; ``restore_threads``, ``restore_cpus``: rank 0's own thread count
        and CPU affinity to restore at close (``rank_numa`` may bind it to its share of the cores); ``meet``: where
        the ranks meet and which this host starts (``hosts.rendezvous``; default: from ``config``)."""
        self.restore_threads, self.restore_cpus = restore_threads, restore_cpus
        self.world_size = config.parallel.tensor_parallel_size
        self.timeout = timeout
        meet = meet or rendezvous(config)
        self.store = dist.TCPStore(meet.master_addr, meet.master_port, self.world_size,
                                   is_master=not meet.agent_store, wait_for_workers=False, timeout=timeout)
        self.meet = dataclasses.replace(meet, master_port=self.store.port)
        self.processes: dict[int, RankProcess] = {}
        for rank in self.meet.spawn:
            self.processes[rank] = RankProcess(
                rank, (TensorShard(rank, self.world_size, arch), config, self.meet, threads, os.getpid(), timeout))
        self.reports: dict[int, dict] = {}       # rank -> what it holds (worker.rank_report)
        self.final_reports: dict[int, dict] = {}  # rank -> its placement when it stopped (worker.final_report)
        self.state: ParallelState | None = None
        self.failed: TensorParallelError | None = None
        self.closed = False
        self._published: set[int] = set()        # LoRA adapter ids whose path the workers can read in the store
        # a script that never closes its engine: stop the workers while the interpreter is whole, not from the
        # process groups' destructors during finalization (which abort with the peers still connected)
        atexit.register(self.close)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes.values()]

    # ---- start-up --------------------------------------------------------------------------------
    def wait_ready(self, rank0_report: dict) -> None:
        """Until every worker has loaded its shard; raise TensorParallelError for one that failed or died, or whose
        KV cache has other than rank 0's blocks (rank 0's scheduler hands out their ids)."""
        self.reports[0] = rank0_report
        num_kv_blocks = rank0_report["num_kv_blocks"]
        deadline = time.monotonic() + START_SECONDS
        while len(self.reports) < self.world_size:
            for rank in range(1, self.world_size):
                if rank not in self.reports and self.store.check([f"ready/{rank}"]):
                    self.reports[rank] = json.loads(self.store.get(f"ready/{rank}"))
            failure = self._failure()
            if failure is not None:
                raise failure
            if time.monotonic() > deadline:
                late = [r for r in range(1, self.world_size) if r not in self.reports]
                raise self._fail(TensorParallelError(late[0], f"did not load its shard within {START_SECONDS} s"))
            time.sleep(POLL_SECONDS)
        for rank, report in self.reports.items():
            if report["num_kv_blocks"] != num_kv_blocks:
                raise self._fail(TensorParallelError(rank, f"its KV cache has {report['num_kv_blocks']} blocks, rank "
                                                           f"0's {num_kv_blocks}; give --num-kv-blocks"))
            if report["arena"] != rank0_report["arena"]:
                raise self._fail(TensorParallelError(rank, f"its device arena {report['arena']} differs from rank "
                                                           f"0's {rank0_report['arena']}: rank 0's run block ids "
                                                           "would not be its runs; give --device-memory-budget"))
            if (report["layer_tiers"], report["expert_tiers"]) != (rank0_report["layer_tiers"],
                                                                   rank0_report["expert_tiers"]):
                raise self._fail(TensorParallelError(rank, f"its plan placed layers {report['tiers']} and experts "
                                                           f"{report['expert_tiers']}, rank 0's {rank0_report['tiers']} "
                                                           f"and {rank0_report['expert_tiers']}; every rank must "
                                                           "follow one plan: give --device-memory-budget"))

    def smallest_free(self, free: int) -> int:
        """The least free device memory of any rank (rank 0's part of ``smallest_across_ranks``)."""
        return smallest_across_ranks(self.store, "free", 0, self.world_size, free, on_wait=self.check_health)

    def agree_draft(self, booking: DraftBooking) -> DraftBooking:
        """Rank 0's draft booking, once every worker has given its own (rank 0's part of ``agreed_draft_booking``)."""
        return agreed_draft_booking(self.store, 0, self.world_size, booking, on_wait=self.check_health)

    def connect(self, device: torch.device) -> ParallelState:
        self.state = ParallelState.connect(self.store, 0, self.world_size, device, self.timeout,
                                           self.meet.gloo_hostname())
        return self.state

    # ---- steps -----------------------------------------------------------------------------------
    def send_step(self, step: HostStep, moves=(), kv=None) -> None:
        send_step(self.state, step, moves, kv)

    def publish_adapter(self, entry) -> None:
        """Where the workers read LoRA adapter ``entry`` (an ``AdapterEntry``) when rank 0 puts it in a slot."""
        if entry.id not in self._published:
            self.store.set(f"lora/{entry.id}", json.dumps({"name": entry.name, "path": entry.path}))
            self._published.add(entry.id)

    def explain(self, error: BaseException) -> TensorParallelError | None:
        """After ``error`` in a step: the worker failure behind it (waiting a few seconds for the failing worker
        to exit or report), or None where every worker is fine."""
        deadline = time.monotonic() + FAILURE_GRACE_SECONDS
        while time.monotonic() < deadline:
            failure = self._failure()
            if failure is not None:
                return failure
            time.sleep(POLL_SECONDS)
        return None

    # ---- failure ---------------------------------------------------------------------------------
    def check_health(self) -> None:
        """Raise the TensorParallelError of a worker that died or reported an error (no collective is involved)."""
        failure = self._failure() if not self.closed else None
        if failure is not None:
            raise failure

    def _failure(self) -> TensorParallelError | None:
        if self.failed is not None:
            return self.failed
        for rank in range(1, self.world_size):        # a worker on another host: its node agent reports for it
            if self.store.check([f"error/{rank}"]):
                return self._fail(TensorParallelError(rank, self.store.get(f"error/{rank}").decode().strip()))
            process = self.processes.get(rank)
            if process is not None and process.exitcode is not None:
                return self._fail(TensorParallelError(rank, exit_reason(process.exitcode)))
        return None

    def _fail(self, error: TensorParallelError) -> TensorParallelError:
        self.failed = error
        return error

    # ---- shutdown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker (a stop message, then terminate and kill whatever is left) and reap it."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        stopping = self.state is not None and self._failure() is None
        if stopping:
            try:
                send_stop(self.state)
            except RuntimeError:   # a worker died since: it is reaped below
                pass
        # workers that never connected wait for rank 0 in the rendezvous: nothing to wait for
        deadline = time.monotonic() + (STOP_SECONDS if stopping else 0)
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
        for rank in self.processes:
            if stopping and self.store.check([f"final/{rank}"]):
                self.final_reports[rank] = json.loads(self.store.get(f"final/{rank}"))
        for process in self.processes.values():
            if process.is_alive():
                process.kill()
                process.join()
        self.state = None
        if self.restore_threads is not None:
            torch.set_num_threads(self.restore_threads)
        if self.restore_cpus is not None and os.sched_getaffinity(0) != self.restore_cpus:
            os.sched_setaffinity(0, self.restore_cpus)


def exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"its process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"its process was killed by signal {-code}"
    return f"its process exited with code {code}"
