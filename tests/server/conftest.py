"""Fixtures that start the real server as a subprocess on a free loopback port; always stopped."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:        # the tests import tests.engine.* helpers, as `python -m pytest` allows
    sys.path.insert(0, ROOT)

TOY_ARGS = ["--model", "toy", "--num-kv-blocks", "256", "--block-size", "4", "--max-model-len", "256"]


@pytest.fixture
def start_toy_server():
    started = []

    def start(*extra):
        from tests.server.helpers import ServerProcess  # httpx and psutil, imported only when a server starts
        server = ServerProcess("tests.server.toy_server", [*TOY_ARGS, *extra])
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def toy_server():
    from tests.server.helpers import ServerProcess
    server = ServerProcess("tests.server.toy_server", TOY_ARGS)
    yield server
    server.stop()
