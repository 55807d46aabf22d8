"""AsyncEngine: the bridge between asyncio handlers and the single-threaded ``LLMEngine``.

ONE thread owns the engine: it loads it (so the HTTP server answers /health 503 meanwhile),
then loops: apply queued commands (add / abort), ``step()`` while there is work, and hand each
``RequestOutput`` to the request's asyncio queue (a step's outputs in one ``loop.call_soon_threadsafe``).
Handlers never call the engine directly. How many requests may be pending is decided before they get here
(``admission``).

The thread never dies of one request: a request the engine rejects gets its own error, and a
fault in the loop itself fails the requests in flight (500) and the loop goes on. An engine that
cannot go on (``EngineDeadError``: a tensor-parallel rank died), seen by a step or by the health
check the loop makes while idle, fails every request, ends the thread and calls ``on_dead``: the
server exits non-zero.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass

from gh200rt.backends.cpu.host_allocator import release_freed_memory
from gh200rt.engine.errors import EngineDeadError
from gh200rt.engine.outputs import RequestOutput
from gh200rt.sampling_params import SamplingParams
from gh200rt.serve.errors import APIError

log = logging.getLogger("gh200rt.serve")

# ``LLMEngine.stats()`` walks the KV pool, so while requests run it is taken at most this often; when work starts
# (the last snapshot was idle) and when the engine goes idle it is taken at once, so /metrics shows a burst from its
# first step (a burst shorter than the interval would otherwise never show) and settles as soon as work ends.
STATS_INTERVAL_SECONDS = 0.25


@dataclass
class _Add:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    params: SamplingParams
    sink: asyncio.Queue
    lora_name: str | None = None
    cache_salt: str | None = None


@dataclass
class _Call:
    fn: object                  # fn(engine) -> result, run on the engine thread between steps
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def _adapter(lora_name: str | None) -> dict:
    return {"lora_request": lora_name} if lora_name is not None else {}


def _put_each(batch: list) -> None:
    for sink, item in batch:
        sink.put_nowait(item)


def _settle(future: asyncio.Future, result, error: Exception | None) -> None:
    if future.done():                           # the caller was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class AsyncEngine:
    def __init__(self, engine_factory, on_load_error=None, cpus: frozenset[int] | None = None, on_dead=None):
        self._factory = engine_factory
        self._cpus = cpus
        self._on_load_error = on_load_error
        self._on_dead = on_dead
        self.engine = None
        self.load_error: BaseException | None = None
        self.dead_error: EngineDeadError | None = None
        self.ready = threading.Event()
        self.metrics = None                      # ServerMetrics; set by the app
        self._commands: queue.Queue = queue.Queue()
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._stats_dirty = True
        self._stats_time = 0.0
        self._stats_busy = False        # whether the last snapshot had requests running or waiting
        self._stepped_since_idle = False
        self._thread = threading.Thread(target=self._run, name="gh200rt-engine", daemon=True)

    # ---- asyncio side ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """False once the engine thread has ended (after shutdown, or a failed load)."""
        return self._thread.is_alive()

    @property
    def num_pending(self) -> int:
        return len(self._sinks)

    def new_request_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids)}"

    def add(self, request_id: str, prompt: str | None, prompt_token_ids: list[int] | None,
            params: SamplingParams, sink: asyncio.Queue | None = None, lora_name: str | None = None,
            cache_salt: str | None = None) -> asyncio.Queue:
        """Queue a request; ``sink`` (shared by the prompts of one HTTP request) gets (kind, request_id,
        payload) items: ("ok", id, None) or ("error", id, APIError) first, then ("output", id, output).
        ``lora_name``: the LoRA adapter it runs under (None: the base model); ``cache_salt``: vLLM's prefix-cache
        salt."""
        if not self.ready.is_set():
            raise APIError(503, "the model is still loading; retry when GET /health answers 200")
        sink = sink if sink is not None else asyncio.Queue()
        self._sinks[request_id] = (asyncio.get_running_loop(), sink)
        self._commands.put(_Add(request_id, prompt, prompt_token_ids, params, sink, lora_name, cache_salt))
        return sink

    async def call(self, fn):
        """``fn(engine)`` on the engine thread between steps (it owns the engine); its result, or its exception."""
        if not self.ready.is_set():
            raise APIError(503, "the model is still loading; retry when GET /health answers 200")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._commands.put(_Call(fn, loop, future))
        return await future

    def abort(self, request_id: str) -> None:
        if self._sinks.pop(request_id, None) is not None:
            self._commands.put(("abort", request_id))

    def finished(self, request_id: str) -> None:
        self._sinks.pop(request_id, None)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._commands.put(("wake", None))
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- engine thread --------------------------------------------------------------------------
    def _run(self) -> None:
        if self._cpus is not None:          # this thread only (Linux); torch's threads, started from it, inherit it
            os.sched_setaffinity(0, self._cpus)
        try:
            self.engine = self._factory()
        except BaseException as e:              # reported by /health and the start-up log
            self.load_error = e
            log.error("loading the model failed: %s: %s", type(e).__name__, e)
            if self._on_load_error is not None:
                self._on_load_error(e)
            return
        if self.metrics is not None:
            self.metrics.cache_info = cache_config_info(self.engine)
        self._publish_stats()
        self.ready.set()
        while not self._stop.is_set():
            try:
                self._iterate()
            except EngineDeadError as e:        # nothing can step any more: fail everything and stop
                self._die(e)
                break
            except Exception as e:              # a fault of ours: fail what is in flight, keep serving
                log.exception("engine loop failed; failing the requests in flight")
                self._fail_all(e)
        close = getattr(self.engine, "close", None)
        if close is not None:                   # stops the transfer backend's worker
            close()

    def _iterate(self) -> None:
        busy = self.engine.has_unfinished_requests()
        try:
            command = self._commands.get_nowait() if busy else self._commands.get(timeout=0.5)
        except queue.Empty:
            command = None
        while command is not None:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                command = None
        if self.engine.has_unfinished_requests():
            self._step()
        elif command is None and not busy:      # half a second without work
            check_health = getattr(self.engine, "check_health", None)   # engines built by hand may lack it
            if check_health is not None:
                check_health()
            self._on_idle()
        self._publish_stats()

    def _on_idle(self) -> None:
        """Once per idle period: the heap pages the steps kept for reuse (``host_allocator``) go back to
        the kernel, so the memory of a burst does not stay resident while nothing runs."""
        if self._stepped_since_idle:
            release_freed_memory()
            self._stepped_since_idle = False

    def _apply(self, command) -> None:
        if isinstance(command, _Add):
            loop_sink = self._sinks.get(command.request_id)
            if loop_sink is None:               # aborted before it reached the engine
                return
            try:
                self.engine.add_request(command.request_id, command.prompt, command.params,
                                        prompt_token_ids=command.prompt_token_ids, **_adapter(command.lora_name),
                                        **({"cache_salt": command.cache_salt} if command.cache_salt else {}))
                self._send(command.request_id, ("ok", None))
            except ValueError as e:             # the engine's verdict on user input
                self._send(command.request_id, ("error", APIError(400, str(e))))
            except Exception as e:              # a fault of ours, confined to this request
                log.exception("adding request %s failed", command.request_id)
                self.engine.abort(command.request_id)
                self._send(command.request_id, ("error", APIError(500, f"internal error: {type(e).__name__}")))
            self._stats_dirty = True
        elif isinstance(command, _Call):
            try:
                result, error = command.fn(self.engine), None
            except Exception as e:              # the caller's to judge (a user error, mostly)
                result, error = None, e
            try:
                command.loop.call_soon_threadsafe(_settle, command.future, result, error)
            except RuntimeError:                # the loop is closed: the server is exiting
                pass
        elif command[0] == "abort":
            self.engine.abort(command[1])
            self._stats_dirty = True

    def _step(self) -> None:
        try:
            outputs: list[RequestOutput] = self.engine.step()
        except EngineDeadError:
            raise
        except Exception as e:                   # a real internal fault: fail the running requests, go on
            log.exception("engine step failed; aborting the running requests")
            for request_id in list(self.engine.requests):
                self.engine.abort(request_id)
                self._send(request_id, ("error", APIError(500, f"internal engine error: {e}")))
            self._stats_dirty = True
            return
        self._send_all(outputs)
        self._stats_dirty = True
        self._stepped_since_idle = True

    def _fail_all(self, error: Exception, message: str | None = None) -> None:
        for request_id in list(self._sinks):
            try:
                self.engine.abort(request_id)
            except Exception:                   # already failing; the error below still reaches the client
                log.exception("aborting %s failed", request_id)
            self._send(request_id, ("error", APIError(500, message or f"internal engine error: {type(error).__name__}")))
        self._stats_dirty = True

    def _die(self, error: EngineDeadError) -> None:
        self.dead_error = error
        log.error("the engine cannot continue: %s", error)
        self._fail_all(error, f"the engine failed and the server is stopping: {error}")
        if self._on_dead is not None:
            self._on_dead(error)

    def _send(self, request_id: str, item) -> None:
        loop_sink = self._sinks.get(request_id)
        if loop_sink is None:
            return
        loop, sink = loop_sink
        try:
            loop.call_soon_threadsafe(sink.put_nowait, (item[0], request_id, item[1]))
        except RuntimeError:                    # the loop is closed: the server is exiting
            pass

    def _send_all(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs, one wake-up per event loop: each ``call_soon_threadsafe`` writes to the loop's
        self-pipe, which at a batch of 64 cost the engine thread more than the rest of its reporting."""
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for output in outputs:
            loop_sink = self._sinks.get(output.request_id)
            if loop_sink is not None:
                loop, sink = loop_sink
                batches.setdefault(loop, []).append((sink, ("output", output.request_id, output)))
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(_put_each, batch)
            except RuntimeError:                # the loop is closed: the server is exiting
                pass

    def _publish_stats(self) -> None:
        now = time.monotonic()
        if self.metrics is None or not self._stats_dirty:
            return
        busy = self.engine.has_unfinished_requests()
        if busy and self._stats_busy and now - self._stats_time < STATS_INTERVAL_SECONDS:
            return
        self._stats_busy = busy
        self._stats_dirty = False
        self._stats_time = now
        self.metrics.engine_stats = self.engine.stats()


def cache_config_info(engine) -> dict | None:
    """vllm:cache_config_info's labels (vLLM's CacheConfig field names) for a real engine (None for stand-ins)."""
    config = getattr(engine, "config", None)
    if config is None or not hasattr(engine, "stats"):
        return None
    cache, memory = config.cache, config.memory
    return {"block_size": cache.block_size, "cache_dtype": cache.kv_cache_dtype,
            "enable_prefix_caching": cache.enable_prefix_caching,
            "gpu_memory_utilization": memory.gpu_memory_utilization,
            "num_gpu_blocks": engine.stats().kv_blocks_total, "num_cpu_blocks": 0}
