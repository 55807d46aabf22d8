"""Test servers and command-line runs forked from one process that has imported torch and the server's modules.

Each server a test starts used to be a new interpreter: ``import torch`` and the server's modules took ~3 s of a toy
server's ~3.2 s start, some 55 times a suite run, and the bench commands' tests paid the same per run. The zygote
imports them once (and runs nothing: no torch op, no thread of its own, so a fork is safe) and forks a child per
server or command, which sets the request's working directory, environment, argv, ``sys.path[0]`` and output files
and runs the module (or script) as ``python -m`` (``python script``) would. The code under test runs whole in the
child, in a process of its own; tests that are about how the interpreter itself starts (an unloadable model, a script
launch, an install) run a new interpreter still.

Protocol: one JSON object a line on the zygote's stdin, one answer a line on its stdout. ``{"start": {...}}`` ->
``{"pid": N}``; ``{"poll": N}`` -> ``{"returncode": int | None}`` (the zygote reaps its children).
"""
from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import traceback

# GH200RT_TEST_FRESH_INTERPRETERS=1: every server and command a test starts runs in a new interpreter instead
FRESH_INTERPRETERS = os.environ.get("GH200RT_TEST_FRESH_INTERPRETERS", "") not in ("", "0")
# what every server imports, preloaded (not the modules that run as __main__: runpy warns when those are imported)
PRELOAD = ("torch", "numpy", "fastapi", "uvicorn", "httpx", "gh200rt.serve.api", "gh200rt.serve.args",
           "gh200rt.serve.async_engine", "gh200rt.engine.engine", "gh200rt.tokenizer.chat_template",
           "tests.engine.toy_model")


def threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def run_child(request: dict, replies: int) -> None:
    """In the forked child: become the server the request describes; never returns."""
    code = 1
    try:
        os.close(replies)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["log"]), (2, request.get("stderr") or request["log"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(out, fd)
            os.close(out)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "script" in request:
            script = os.path.abspath(request["script"])
            sys.argv = [request["script"], *request["argv"]]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
        else:
            sys.argv = [request["module"], *request["argv"]]
            sys.path[0] = os.getcwd()
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except BaseException:   # noqa: BLE001 - what python -m prints and exits 1 with
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:   # noqa: BLE001 - exiting anyway
                pass
        os._exit(code)


def serve(inputs, outputs, threads_at_start: int) -> None:
    """Answer requests until the test process closes the zygote's stdin."""
    exited: dict[int, int] = {}

    def answer(message: dict) -> None:
        outputs.write(json.dumps(message) + "\n")
        outputs.flush()

    for line in inputs:
        message = json.loads(line)
        if "start" in message:
            if threads() > threads_at_start:    # a fork would copy another thread's locks mid-use: refuse, and
                answer({"error": f"the zygote runs {threads()} threads"})    # the test side starts an interpreter
                continue
            pid = os.fork()
            if pid == 0:
                run_child(message["start"], outputs.fileno())
            answer({"pid": pid})
        elif "poll" in message:
            pid = message["poll"]
            if pid not in exited:
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done, status = pid, 255 << 8     # not a child of this zygote: report it gone
                if done:
                    exited[pid] = os.waitstatus_to_exitcode(status)
            answer({"returncode": exited.get(pid)})


def main() -> None:
    for name in PRELOAD:
        __import__(name)
    # numpy's OpenBLAS starts its idle thread server at import; it stops and restarts it around a fork itself
    # (pthread_atfork), as every forked torch DataLoader worker relies on. Nothing here may start another.
    started = threads()
    replies = os.fdopen(os.dup(1), "w")      # the answers; fd 1 itself is what children replace with their logs
    replies.write(json.dumps({"ready": started}) + "\n")
    replies.flush()
    serve(sys.stdin, replies, started)


if __name__ == "__main__":
    main()


# ---- the test process's side ----------------------------------------------------------------------------------------
class ForkedProcess:
    """The part of ``subprocess.Popen`` the server tests use, for a server the zygote forked."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.ask({"poll": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"server {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The zygote process, started on first use and stopped when the test process exits."""

    def __init__(self, root: str):
        import atexit
        import subprocess
        import threading
        self.lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.zygote"], cwd=root, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env={**os.environ, "PYTHONPATH": root})
        self.ready = json.loads(self.proc.stdout.readline() or "null")
        atexit.register(self.close)

    def ask(self, message: dict) -> dict:
        with self.lock:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the test servers' zygote exited")
        return json.loads(line)

    def start(self, module: str, argv: list[str], cwd: str, env: dict, log: str, stderr: str | None = None,
              script: str | None = None) -> ForkedProcess | None:
        """``python -m module *argv`` (or ``python script *argv``) forked, its output to ``log`` (its standard error
        to ``stderr`` where given); None where the zygote cannot fork one (start a new interpreter then)."""
        if self.ready is None or self.proc.poll() is not None:
            return None
        request = {"module": module, "argv": argv, "cwd": cwd, "env": env, "log": log, "stderr": stderr}
        if script is not None:
            request["script"] = script
        answer = self.ask({"start": request})
        return ForkedProcess(self, answer["pid"]) if "pid" in answer else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(10)


_zygote: Zygote | None = None


def zygote(root: str) -> Zygote:
    global _zygote
    if _zygote is None:
        _zygote = Zygote(root)
    return _zygote


def run_python(args: list[str], cwd: str, timeout: float, env: dict | None = None, capture_output: bool = True,
               text: bool = True):
    """``subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)``
    for ``args`` = ``["-m", module, ...]`` or ``[script, ...]``, forked from the zygote (a new interpreter where it
    cannot fork)."""
    assert capture_output and text, "run_python captures the output as text"
    import subprocess
    import tempfile
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args, cwd = [os.fspath(a) for a in args], os.fspath(cwd)
    env = dict(env) if env is not None else {**os.environ, "PYTHONPATH": root}
    module, script, argv = (args[1], None, args[2:]) if args[0] == "-m" else ("", args[0], args[1:])
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        proc = None if FRESH_INTERPRETERS else zygote(root).start(module, argv, cwd, env, out, err, script)
        if proc is None:
            return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                                  env=env)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
        with open(out) as o, open(err) as e:
            return subprocess.CompletedProcess([sys.executable, *args], code, o.read(), e.read())
