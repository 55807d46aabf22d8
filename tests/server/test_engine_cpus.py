"""--engine-cpus: the engine thread (and the torch threads it starts) runs on the CPUs named, the
HTTP side keeps the process's own set; bad lists are a clear start-up error."""
import os
import threading

import pytest

from gh200rt.serve.args import ServerConfig, parse_args, parse_cpu_list
from gh200rt.serve.async_engine import AsyncEngine

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")


def test_cpu_lists_parse():
    first = min(os.sched_getaffinity(0))
    assert parse_cpu_list(str(first)) == {first}
    allowed = sorted(os.sched_getaffinity(0))
    if allowed == list(range(allowed[0], allowed[-1] + 1)):
        assert parse_cpu_list(f"{allowed[0]}-{allowed[-1]}") == set(allowed)


@pytest.mark.parametrize("bad", ["", "a", "3-1", "-1", "0,,1", "0-x"])
def test_malformed_cpu_lists_name_the_flag(bad):
    with pytest.raises(ValueError, match="--engine-cpus"):
        ServerConfig(engine_cpus=bad)


def test_cpus_the_process_may_not_use_are_refused():
    outside = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(ValueError, match=f"CPUs \\[{outside}\\] are not among"):
        ServerConfig(engine_cpus=str(outside))
    with pytest.raises(SystemExit):
        parse_args(["--engine-cpus", str(outside)])


class _IdleEngine:
    def has_unfinished_requests(self):
        return False


def test_the_engine_thread_runs_on_the_cpus_and_the_caller_keeps_its_own():
    before = os.sched_getaffinity(0)
    cpu = min(before)
    seen = {}

    def factory():
        seen["engine"] = os.sched_getaffinity(0)
        seen["thread"] = threading.current_thread().name
        return _IdleEngine()

    engine = AsyncEngine(factory, cpus=frozenset({cpu}))
    engine.start()
    assert engine.ready.wait(10)
    engine.shutdown()
    assert seen == {"engine": {cpu}, "thread": "gh200rt-engine"}
    assert os.sched_getaffinity(0) == before
