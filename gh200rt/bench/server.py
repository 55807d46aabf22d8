"""A gh200rt server that a benchmark starts, waits for and stops, and what it asks of one.

``served(args)`` gives the URL a run loads: ``--url``, or ``python -m gh200rt.serve`` started from the tree this
package runs from (``CHECKOUT``) on a free port, healthy, and stopped on leaving (SIGTERM, then SIGKILL).
scripts/serve_smoke.py uses the same pieces for an installed server. ``SCHEMA`` is the JSON schema the structured
requests of both ask for.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]   # holds the gh200rt package that runs: a checkout, or site-packages
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}}


class ServerStartFailed(RuntimeError):
    """The started server never became healthy; the message holds the reason and its log's tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(client, proc: subprocess.Popen, timeout: float) -> str | None:
    """None once /health answers 200; else why not (the server exited, or the timeout passed)."""
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the server exited with {proc.returncode} before it was healthy"
        try:
            if client.get("/health").status_code == 200:
                return None
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    return f"/health did not answer 200 within {timeout:.0f} s"


def stop(proc: subprocess.Popen, timeout: float) -> str:
    """SIGTERM, then SIGKILL; returns how it ended."""
    if proc.poll() is not None:
        return f"had exited ({proc.returncode})"
    proc.send_signal(signal.SIGTERM)
    try:
        return f"stopped by SIGTERM ({proc.wait(timeout)})"
    except subprocess.TimeoutExpired:
        proc.kill()
        return f"killed after {timeout:.0f} s ({proc.wait()})"


def start_server(args) -> tuple[subprocess.Popen, str, Path]:
    """``python -m <args.server_module>`` from ``CHECKOUT`` on a free port with ``args.server_args``: (process, URL,
    its log)."""
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="gh200rt-soak-", suffix=".log")[1])
    argv = [sys.executable, "-m", args.server_module, "--port", str(port), "--log-level", "warning",
            *shlex.split(args.server_args)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=CHECKOUT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(CHECKOUT)})
    print(f"server pid {proc.pid}: {' '.join(argv[1:])}; log {log_path}", flush=True)
    return proc, f"http://127.0.0.1:{port}", log_path


@contextlib.contextmanager
def served(args):
    """The URL a run loads: ``--url``, or a server started from this checkout, healthy, stopped on leaving."""
    if args.url:
        yield args.url.rstrip("/")
        return
    import httpx
    proc, url, log_path = start_server(args)
    try:
        with httpx.Client(base_url=url, timeout=10) as client:
            unhealthy = wait_healthy(client, proc, args.load_timeout)
        if unhealthy:
            raise ServerStartFailed(f"{unhealthy}\n{log_path.read_text()[-3000:]}")
        yield url
    finally:
        print(f"server: {stop(proc, 30.0)}", flush=True)


def add_server_arguments(parser) -> None:
    """The flags of ``served``: a running server, or the module and flags of the one to start."""
    parser.add_argument("--url", help="a running server (default: start one from this checkout)")
    parser.add_argument("--server-module", default="gh200rt.serve", help="the module the started server runs")
    parser.add_argument("--server-args", default="", help="flags for the started server (one string)")
    parser.add_argument("--load-timeout", type=float, default=600.0,
                        help="seconds for a started server to be healthy")
