"""Start ``python -m gh200rt.serve`` from the installed gh200rt and send it what users send.

    python scripts/serve_smoke.py --random-model llama3-8b --random-model-dir DIR [--json PATH]
    python scripts/serve_smoke.py --model smollm2-135m

The server runs under this interpreter from an empty temporary directory, with this checkout left off
PYTHONPATH, so it imports the installed gh200rt (a regular install: a module its wheel misses fails here,
not in a user's hands). It runs in this process's group, so a caller that kills the group on a time cap
(scripts/validate_gpu.py) takes the server with it.

Checks, over /v1/completions: sampled (temperature, top_p, seed; the same seed gives the same text),
streamed (SSE chunks up to ``[DONE]``, usage last), structured (``response_format`` json_schema: a
finished answer must parse and match), n=2 (two choices); then a short ``python -m gh200rt.bench serve`` run
(streamed, concurrent). Any failed request fails the run (exit 1). The server is always stopped:
SIGTERM, then SIGKILL after --stop-timeout seconds, on success, failure, Ctrl-C or SIGTERM alike.

scripts/validate_steps.py imports this module for its command lines (``server_argv``, ``bench_argv``) before
gh200rt is installed: gh200rt is imported inside the functions that run the smoke test, not at the top.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVED_NAME = "smoke"
PROMPT = "The quick brown fox"
DEFAULT_VOCAB = 49152  # SmolLM2's; a model directory's config.json gives its own


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def server_argv(py: str, model: str, port: int) -> list[str]:
    return [py, "-m", "gh200rt.serve", "--model", model, "--served-model-name", SERVED_NAME, "--port", str(port),
            "--max-model-len", "1024", "--max-num-seqs", "16", "--shutdown-timeout", "5", "--log-level", "warning"]


def bench_argv(py: str, base_url: str, vocab: int, prompts: int = 32) -> list[str]:
    return [py, "-m", "gh200rt.bench", "serve", "--base-url", base_url, "--model", SERVED_NAME, "--num-prompts",
            str(prompts), "--input-len", "64", "--output-len", "16", "--max-concurrency", "8", "--vocab-size",
            str(vocab)]


def install_env() -> dict[str, str]:
    """This environment without PYTHONPATH entries inside the checkout (they would shadow the install)."""
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    return env if kept else {k: v for k, v in env.items() if k != "PYTHONPATH"}


def installed_from(py: str, cwd: str, env: dict) -> str:
    code = "import os, gh200rt; print(os.path.dirname(gh200rt.__file__))"
    proc = subprocess.run([py, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return proc.stdout.strip() if proc.returncode == 0 else f"gh200rt does not import: {proc.stderr.strip()[-500:]}"


def completion(client, **body) -> dict:
    r = client.post("/v1/completions", json={"model": SERVED_NAME, "prompt": PROMPT, **body})
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
    return r.json()


def check_sampled(client) -> str:
    body = dict(max_tokens=8, temperature=0.8, top_p=0.95, seed=7)
    first, again = completion(client, **body), completion(client, **body)
    text = first["choices"][0]["text"]
    if first["usage"]["completion_tokens"] < 1:
        raise RuntimeError(f"no tokens generated: {first}")
    if again["choices"][0]["text"] != text:
        raise RuntimeError(f"the same seed gave {text!r}, then {again['choices'][0]['text']!r}")
    return f"{first['usage']['completion_tokens']} tokens, the same for the same seed: {text!r}"


def check_streamed(client) -> str:
    body = {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.7, "seed": 1, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks, done, usage = [], False, None
    with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                chunks += [c["text"] for c in chunk.get("choices", []) if c.get("text")]
    if not done or not chunks or not usage:
        raise RuntimeError(f"stream incomplete: {len(chunks)} text chunks, [DONE] {'seen' if done else 'missing'}, "
                           f"usage {usage}")
    return f"{len(chunks)} chunks, {usage['completion_tokens']} tokens, [DONE]: {''.join(chunks)!r}"


def check_structured(client) -> str:
    from gh200rt.bench.server import SCHEMA
    answer = completion(client, max_tokens=48, temperature=0.7, seed=2,
                        response_format={"type": "json_schema", "json_schema": {"name": "smoke", "schema": SCHEMA}})
    choice = answer["choices"][0]
    if choice["finish_reason"] != "stop":
        return f"did not close within 48 tokens (finish {choice['finish_reason']}): {choice['text']!r}"
    value = json.loads(choice["text"])
    if not (isinstance(value, dict) and set(value) == {"ok", "n"} and isinstance(value["ok"], bool)
            and isinstance(value["n"], int) and 0 <= value["n"] <= 9):
        raise RuntimeError(f"the answer does not match the schema: {choice['text']!r}")
    return f"matches the schema: {choice['text']!r}"


def check_n2(client) -> str:
    answer = completion(client, max_tokens=8, temperature=1.0, n=2, seed=3)
    indices = sorted(c["index"] for c in answer["choices"])
    if indices != [0, 1]:
        raise RuntimeError(f"choices {indices}, expected [0, 1]")
    return "two choices: " + ", ".join(repr(c["text"]) for c in answer["choices"])


def check_bench(base_url: str, vocab: int) -> str:
    proc = subprocess.run(bench_argv(sys.executable, base_url, vocab), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    print(proc.stdout, end="", flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench serve exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-600:]}")
    return next((line.strip() for line in proc.stdout.splitlines() if line.startswith("output tokens/s")), "ran")


CHECKS = {"sampled": check_sampled, "streamed": check_streamed, "structured json_schema": check_structured,
          "n=2": check_n2}


def run_checks(base_url: str, vocab: int) -> list[Check]:
    import httpx
    checks = []
    with httpx.Client(base_url=base_url, timeout=120) as client:
        for name, fn in CHECKS.items():
            try:
                checks.append(Check(name, True, fn(client)))
            except Exception as exc:  # any failure of a request is a finding, reported with its reason
                checks.append(Check(name, False, f"{type(exc).__name__}: {exc}"))
    try:
        checks.append(Check("bench_serving", True, check_bench(base_url, vocab)))
    except Exception as exc:
        checks.append(Check("bench_serving", False, f"{type(exc).__name__}: {exc}"))
    return checks


def vocab_of(model: str) -> int:
    config = Path(model) / "config.json"
    return json.loads(config.read_text()).get("vocab_size", DEFAULT_VOCAB) if config.is_file() else DEFAULT_VOCAB


def smoke(model: str, load_timeout: float, stop_timeout: float) -> dict:
    import httpx

    from gh200rt.bench.server import free_port, stop, wait_healthy
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = install_env()
    with tempfile.TemporaryDirectory(prefix="gh200rt-serve-smoke-") as cwd:
        source = installed_from(sys.executable, cwd, env)
        print(f"gh200rt imported from {source}" + (" (this checkout: not a regular install)"
                                                   if source.startswith(str(ROOT)) else ""), flush=True)
        log_path = Path(cwd) / "server.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(server_argv(sys.executable, str(Path(model).resolve()) if Path(model).exists()
                                                else model, port), cwd=cwd, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        print(f"server pid {proc.pid} at {base_url}, log {log_path}", flush=True)
        start = time.monotonic()
        try:
            with httpx.Client(base_url=base_url, timeout=10) as client:
                unhealthy = wait_healthy(client, proc, load_timeout)
            load_s = time.monotonic() - start
            checks = [Check("start", False, unhealthy)] if unhealthy else \
                [Check("start", True, f"healthy after {load_s:.1f} s")] + run_checks(base_url, vocab_of(model))
        finally:
            ended = stop(proc, stop_timeout)
        log_tail = log_path.read_text()[-4000:]
    print(f"server: {ended}", flush=True)
    return {"model": model, "gh200rt_from": source, "checks": [asdict(c) for c in checks],
            "ok": all(c.ok for c in checks), "server_pid": proc.pid, "server_stopped": ended,
            "server_log_tail": log_tail}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from gh200rt.bench.random_model import add_random_model_arguments, model_of
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="what the server loads (--model of gh200rt.serve)")
    add_random_model_arguments(parser)
    parser.add_argument("--load-timeout", type=float, default=120.0, help="seconds for the server to become healthy")
    parser.add_argument("--stop-timeout", type=float, default=15.0, help="seconds SIGTERM has before SIGKILL")
    parser.add_argument("--json", type=Path, help="also write every check and the server's log tail here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM still stops the server (finally, above)
    with model_of(args) as model:
        result = smoke(model, args.load_timeout, args.stop_timeout)
    for c in result["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
    if not result["ok"]:
        print(f"server log (last lines):\n{result['server_log_tail'][-2500:]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
