"""``python -m gh200rt.serve``: start the HTTP server at once, load the model in the engine thread.

/health answers 503 until the model is loaded. SIGTERM (or Ctrl-C): new generation requests get
503, in-flight ones may finish for up to --shutdown-timeout seconds, then the process exits 0.
A second signal exits at once. An engine that cannot go on (a tensor-parallel rank died) fails
what is in flight and the process exits 1, naming the rank and the reason.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

import uvicorn

from gh200rt.serve.admission import Admission
from gh200rt.serve.api import create_app
from gh200rt.serve.state import ServerState
from gh200rt.serve.args import parse_args, parse_cpu_list
from gh200rt.serve.async_engine import AsyncEngine

log = logging.getLogger("gh200rt.serve")


def describe_platform(p) -> str:
    """The platform the engine was placed on (detected once, at its start-up)."""
    if p is None:
        return "none recorded (weights placed by hand)"
    return (f"{p.kind} (profile {p.profile}): device {p.device_name}, {p.device_memory_bytes / 2**30:.1f} GiB "
            f"device memory, host NUMA node {p.host_numa_node}, host->device {p.link_h2d_gbps:g} GB/s, "
            f"direct read {p.direct_read_gbps:g} GB/s, ATS {'yes' if p.ats else 'no'}")


def describe_engine(engine) -> str:
    """The plan's table (``Plan.explain()``); without a plan, what the engine itself reports."""
    plan = getattr(engine, "plan", None)
    if plan is not None and callable(getattr(plan, "explain", None)):
        try:
            return plan.explain()
        except Exception:
            log.exception("Plan.explain() failed; describing the engine without it")
    try:
        stats = engine.stats()
        tiers = ", ".join(f"{n} {tier}" for tier, n in (stats.layers_per_tier or {}).items() if n) or "tiers unknown"
        bs = engine.config.cache.block_size
        return (f"no plan (weights placed by hand): layers {tiers}; KV cache {stats.kv_blocks_total} blocks x {bs} "
                f"tokens = {stats.kv_blocks_total * bs} tokens; max_model_len {engine.max_model_len}")
    except Exception as e:
        return f"no plan, and the engine could not describe itself ({type(e).__name__}: {e})"


class GracefulServer(uvicorn.Server):
    """First signal: refuse new work (503) and wait for pending requests, then stop uvicorn."""

    def __init__(self, config: uvicorn.Config, state: ServerState, timeout: float):
        super().__init__(config)
        self.state = state
        self.timeout = timeout

    def handle_exit(self, sig, frame) -> None:
        if self.state.shutting_down:
            self.force_exit = True
            self.should_exit = True
            return
        self.state.shutting_down = True
        log.info("signal %s: refusing new requests, waiting up to %.0fs for %d in flight",
                 sig, self.timeout, self.state.admission.held)
        threading.Thread(target=self._drain, name="gh200rt-drain", daemon=True).start()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.timeout
        while (self.state.admission.held or self.state.engine.num_pending) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.config.timeout_graceful_shutdown = max(0.5, deadline - time.monotonic())
        self.should_exit = True


def main(argv=None) -> int:
    server_config, engine_config = parse_args(argv)
    from gh200rt.distributed.hosts import rendezvous, torchrun_config
    engine_config = torchrun_config(engine_config)
    if engine_config.parallel.tensor_parallel_size > 1:
        meet = rendezvous(engine_config)
        if meet.own_rank != 0:           # another host's ranks (or a torchrun rank > 0): no server here
            from gh200rt.distributed.node import run_ranks
            logging.basicConfig(level=server_config.log_level.upper(),
                                format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            return run_ranks(engine_config, meet)

    def build_engine():
        from gh200rt.engine.engine import LLMEngine
        return LLMEngine.from_config(engine_config)

    return run_server(server_config, engine_config, build_engine)


def run_server(server_config, engine_config, build_engine) -> int:
    """Serve until a signal; ``build_engine()`` runs in the engine thread and returns an LLMEngine."""
    logging.basicConfig(level=server_config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def load():
        start = time.monotonic()
        engine = build_engine()
        log.info("platform: %s", describe_platform(getattr(engine, "platform", None)))
        log.info("model %s loaded in %.1fs; plan:\n%s", engine_config.model.model, time.monotonic() - start,
                 describe_engine(engine))
        speculator = getattr(engine, "speculator", None)
        if speculator is not None:
            note = " (async scheduling: each step's report overlaps the next step)" \
                if getattr(engine, "async_scheduling", None) == "report" else ""
            log.info("speculative decoding: %s%s", speculator.method.describe(), note)
        return engine

    max_num_seqs = engine_config.scheduler.max_num_seqs
    limit, limit_flags, raise_flag = server_config.admission_limit(max_num_seqs)
    admission = Admission(limit, max_num_seqs, limit_flags, raise_flag)

    def stop_on_engine_error(_error):
        server.should_exit = True

    cpus = parse_cpu_list(server_config.engine_cpus) if server_config.engine_cpus is not None else None
    engine = AsyncEngine(load, on_load_error=stop_on_engine_error, cpus=cpus, on_dead=stop_on_engine_error)
    state = ServerState(server_config, engine, engine_config.model.model, admission,
                        engine_config.model.max_logprobs)
    app = create_app(state)
    uv_config = uvicorn.Config(app, host=server_config.host, port=server_config.port,
                               log_level=server_config.log_level, access_log=False,
                               timeout_graceful_shutdown=server_config.shutdown_timeout, lifespan="off")
    server = GracefulServer(uv_config, state, server_config.shutdown_timeout)
    engine.start()
    log.info("serving %s at http://%s:%d/v1 (health: /health)", state.served_name, server_config.host,
             server_config.port)
    server.run()
    engine.shutdown()
    if engine.load_error is not None:
        log.error("exiting: the model %r could not be loaded (see the error above)", engine_config.model.model)
        return 1
    if engine.dead_error is not None:
        log.error("exiting: %s", engine.dead_error)
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
