"""The test servers' zygote (tests/zygote.py): a forked server runs its module as ``python -m`` would, with
the request's argv, working directory, environment and log, and its exit code comes back."""
import os
import signal

import pytest

pytest.importorskip("httpx")
pytest.importorskip("psutil")

from tests.server.helpers import ROOT  # noqa: E402
from tests.zygote import zygote  # noqa: E402


def start(tmp_path, **env):
    log = tmp_path / "probe.log"
    proc = zygote(ROOT).start("tests.zygote_probe", ["--flag", "x"], str(tmp_path),
                              {**os.environ, "PYTHONPATH": ROOT, **env}, str(log))
    assert proc is not None, f"the zygote did not fork: {zygote(ROOT).ready}"
    return proc, log


def test_a_forked_module_gets_its_argv_cwd_env_log_and_exit_code(tmp_path):
    gate = tmp_path / "gate"
    proc, log = start(tmp_path, ZYGOTE_PROBE="seen", ZYGOTE_PROBE_EXIT="3", ZYGOTE_PROBE_GATE=str(gate))
    assert proc.poll() is None, "still waiting at its gate"
    gate.touch()
    assert proc.wait(30) == 3
    assert log.read_text() == f"argv ['--flag', 'x'] cwd {tmp_path} env seen\n"
    assert "ZYGOTE_PROBE" not in os.environ


def test_a_killed_server_reports_its_signal(tmp_path):
    proc, _ = start(tmp_path, ZYGOTE_PROBE_GATE=str(tmp_path / "never"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    proc.kill()                  # gone already: nothing to signal
    assert proc.poll() == -signal.SIGTERM
