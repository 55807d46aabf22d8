"""ServerConfig (the HTTP side) and the ``serve`` command line, generated from the config
dataclasses (``gh200rt.cli_args``) so flags never drift from the config."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from gh200rt.cli_args import add_dataclass_arguments, add_engine_arguments, dataclass_from_args
from gh200rt.config.flags import flag_help
from gh200rt.serve.reasoning import PARSERS as REASONING
from gh200rt.serve.tool_parsers import PARSERS

TOOL_CALL_PARSERS = tuple(PARSERS)
REASONING_PARSERS = tuple(REASONING)


@dataclass(frozen=True)
class ServerConfig:
    host: str = field(default="127.0.0.1", metadata=flag_help("address to listen on (0.0.0.0 for all interfaces)"))
    port: int = field(default=8000, metadata=flag_help("TCP port to listen on"))
    api_key: str | None = field(default=None, metadata=flag_help(
        "require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY') on every route except /health"))
    served_model_name: tuple[str, ...] | None = field(default=None, metadata={
        "help": "model name(s) clients send; the first is the one /v1/models and responses show, the others are "
                "aliases; default: --model", "nargs": "+"})
    max_queued_requests: int = field(default=256, metadata=flag_help(
        "sequences (a request's prompts x n) that may wait beyond --max-num-seqs running ones (SGLang's name); "
        "a request that would pass the bound gets 503 with Retry-After at once"))
    max_num_queued_reqs: int | None = field(default=None, metadata=flag_help(
        "vLLM's name for the same bound, counted as vLLM counts it: sequences queued and running together; "
        "when given it replaces --max-num-seqs + --max-queued-requests"))
    shutdown_timeout: float = field(default=30.0, metadata=flag_help(
        "seconds SIGTERM waits for in-flight requests before exiting"))
    allowed_origins: str = field(default="*", metadata=flag_help(
        "CORS origins, comma-separated ('*' = any, '' = CORS off)"))
    max_request_bytes: int = field(default=8 * 1024 * 1024, metadata=flag_help(
        "largest request body accepted; larger ones get 413"))
    log_level: str = field(default="info", metadata=flag_help("uvicorn/server log level (debug, info, warning)"))
    tool_call_parser: str | None = field(default=None, metadata={
        "help": "how tool calls are read out of the model's text for \"tool_choice\": \"auto\" (hermes: Hermes/"
                "Qwen <tool_call>; llama3_json: Llama 3.x JSON; deepseek_v3: DeepSeek-V3 / R1; deepseek_v31: "
                "DeepSeek-V3.1 / V3.2; glm45: GLM-4.5 / 4.6; qwen3_coder: Qwen3-Coder)", "choices": TOOL_CALL_PARSERS})
    reasoning_parser: str | None = field(default=None, metadata={
        "help": "split a thinking model's <think> block from its answer into 'reasoning' / 'reasoning_content' "
                "(deepseek_r1: the answer starts inside the block, as DeepSeek-R1's template opens it; qwen3, "
                "glm45: a block the model opens itself)", "choices": REASONING_PARSERS})
    enable_auto_tool_choice: bool = field(default=False, metadata=flag_help(
        "let the model decide to call tools (\"tool_choice\": \"auto\"); needs --tool-call-parser"))
    trust_request_chat_template: bool = field(default=False, metadata=flag_help(
        "render a chat request's own 'chat_template' (vLLM's flag); without it such a request is a 400. The "
        "sandbox keeps a template from the host, but a template can take unbounded time and memory: trust the "
        "clients first"))
    enable_force_include_usage: bool = field(default=False, metadata=flag_help(
        "end every streamed completion and chat answer with a usage chunk, asked for or not (vLLM's flag)"))
    enable_server_load_tracking: bool = field(default=False, metadata=flag_help(
        "answer GET /load with the generation requests in flight, {\"server_load\": N} (vLLM's flag; without it "
        "/load is a 404 saying so)"))
    enable_prompt_tokens_details: bool = field(default=False, metadata=flag_help(
        "vLLM's flag for usage.prompt_tokens_details (cached_tokens): this server always reports it, so the flag "
        "changes nothing"))
    max_stored_responses: int = field(default=1000, metadata=flag_help(
        "responses /v1/responses keeps in memory for GET, previous_response_id and cancel (those made with store "
        "true, the default); past it the least recently used is forgotten"))
    engine_cpus: str | None = field(default=None, metadata=flag_help(
        "CPUs the engine thread and the torch threads it starts run on, e.g. 0 or 0-3,8 (what vLLM's "
        "VLLM_CPU_OMP_THREADS_BIND does for its CPU backend); the HTTP side stays free to run elsewhere. "
        "Default: wherever the OS schedules them"))

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.max_queued_requests < 0:
            raise ValueError(f"--max-queued-requests must be 0 or more, got {self.max_queued_requests}")
        if self.max_num_queued_reqs is not None and self.max_num_queued_reqs < 1:
            raise ValueError(f"--max-num-queued-reqs must be at least 1, got {self.max_num_queued_reqs}; leave it "
                             "out to bound the queue with --max-queued-requests")
        if self.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout must be 0 or more seconds, got {self.shutdown_timeout}")
        if self.max_request_bytes < 1024:
            raise ValueError(f"--max-request-bytes must be at least 1024, got {self.max_request_bytes}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError(f"--log-level {self.log_level!r}: choose debug, info, warning or error")
        if self.served_model_name is not None:
            names = (self.served_model_name,) if isinstance(self.served_model_name, str) else self.served_model_name
            if not names or not all(names):
                raise ValueError("--served-model-name needs at least one non-empty name")
            object.__setattr__(self, "served_model_name", tuple(names))
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError(f"--enable-auto-tool-choice needs --tool-call-parser ({', '.join(TOOL_CALL_PARSERS)})")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"--tool-call-parser {self.tool_call_parser!r}: choose {', '.join(TOOL_CALL_PARSERS)}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"--reasoning-parser {self.reasoning_parser!r}: choose {', '.join(REASONING_PARSERS)}")
        if self.max_stored_responses < 0:
            raise ValueError(f"--max-stored-responses must be 0 or more, got {self.max_stored_responses}")
        if self.engine_cpus is not None:
            parse_cpu_list(self.engine_cpus)
        if self.api_key is not None and not self.api_key:
            raise ValueError("--api-key must not be empty; leave it out to serve without a key")

    def admission_limit(self, max_num_seqs: int) -> tuple[int, str, str]:
        """(sequences held at once, how that was set, the flag that raises it), for admission's messages."""
        if self.max_num_queued_reqs is not None:
            return (self.max_num_queued_reqs, f"--max-num-queued-reqs {self.max_num_queued_reqs}",
                    "--max-num-queued-reqs")
        return (max_num_seqs + self.max_queued_requests,
                f"--max-num-seqs {max_num_seqs} + --max-queued-requests {self.max_queued_requests}",
                "--max-queued-requests")

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(o.strip() for o in self.allowed_origins.split(",") if o.strip())


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0-3,8"`` -> {0, 1, 2, 3, 8}; every CPU must be one this process may run on."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            lo, hi = int(first), int(last or first)
            if lo < 0 or hi < lo:
                raise ValueError
            cpus.update(range(lo, hi + 1))
    except ValueError:
        raise ValueError(f"--engine-cpus {text!r}: give CPU numbers and ranges, e.g. 0 or 0-3,8") from None
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else cpus
    if not cpus <= allowed:
        raise ValueError(f"--engine-cpus {text!r}: CPUs {sorted(cpus - allowed)} are not among the ones this "
                         f"process may use ({sorted(allowed)})")
    return frozenset(cpus)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gh200rt.serve",
                                     description="OpenAI-compatible HTTP server for gh200rt")
    add_dataclass_arguments(parser, ServerConfig, "server")
    add_engine_arguments(parser)
    return parser


def parse_args(argv=None):
    """-> (ServerConfig, EngineConfig); bad values exit 2 with the message naming the flag."""
    from gh200rt.config import EngineConfig
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return dataclass_from_args(ServerConfig, args), dataclass_from_args(EngineConfig, args)
    except ValueError as e:
        parser.error(str(e))
