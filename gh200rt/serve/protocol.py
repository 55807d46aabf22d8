"""OpenAI request bodies -> validated ``ParsedRequest``s (prompts + ``SamplingParams``).

Every rule an OpenAI or vLLM client relies on is checked here, before the engine sees the
request, and a violation raises ``APIError(400)`` naming the field and the allowed values.
The fields each route reads or refuses are declared in ``fields`` (the README's API tables list them); a
field in none of them is a 400 naming it. Known OpenAI and vLLM fields this server cannot honour (``suffix``,
beam search, ``lora_request`` / ``lora_name`` (``model`` names an adapter), images and audio,
``kv_transfer_params``, ``priority`` other than 0, ...) are a 400 naming the field when their value asks for
something, rather than silently ignored. llama.cpp's own fields (``n_predict``, ``repeat_penalty``, ``samplers``,
``mirostat``, ...) are read or refused in ``llamacpp_fields``.

Logprob counts are bounded by ``--max-logprobs``; -1 (the whole vocabulary) is resolved against the
model's vocabulary once it is loaded (``resolve_whole_vocab``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from gh200rt.config import ModelConfig
from gh200rt.sampling_params import (GREEDY_BELOW, MAX_LOGPROB_TOKEN_IDS, SEED_MAX, SEED_MIN, WHOLE_VOCAB,
                                     SamplingParams)
from gh200rt.serve.errors import bad_request
from gh200rt.serve.fields import COMPLETION, COMPLETION_REFUSED, REFUSED, declared, refuse_unhonoured
from gh200rt.serve.llamacpp_fields import (ban_or_bias, check_penalize_nl, check_sampler_order, choices,
                                           llama_logit_bias, max_tokens as llama_max_tokens, refuse_non_defaults,
                                           repetition)
from gh200rt.serve.structured_fields import parse_constraint
from gh200rt.serve.truncation import PromptTruncation, parse_truncation

MAX_N = 16
MAX_CACHE_SALT_CHARS = 1024         # vLLM's bound
MAX_REQUEST_ID_CHARS = 256
DEFAULT_MAX_LOGPROBS = ModelConfig.max_logprobs


@dataclass
class ParsedRequest:
    prompts: list[tuple[str | None, list[int] | None]]   # (text, token ids): exactly one is set
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None
    model: str | None = None
    add_special_tokens: bool = True          # vLLM: a completion prompt's text gets the tokenizer's BOS etc.
    return_token_ids: bool = False           # vLLM: token ids of the prompt and of each choice in the response
    continuous_usage: bool = False           # stream_options.continuous_usage_stats: usage on every chunk
    prompt_logprobs: int | None = None       # vLLM: top-k logprobs of every prompt token in the response
    logprobs_param: str = "logprobs"         # the field that asked for logprobs: "top_logprobs" on chat
    return_tokens_as_token_ids: bool = False  # vLLM: logprob tokens written "token_id:N"
    logprob_ids: bool = False                # llama.cpp's n_probs: each chat logprob entry carries its token "id"
    truncation: PromptTruncation | None = None   # vLLM: truncate_prompt_tokens / truncation_side
    cache_salt: str | None = None            # vLLM: requests with different salts never share prefix-cache blocks
    request_id: str | None = None            # vLLM: the response's id is "cmpl-" / "chatcmpl-" and this
    extra: dict = field(default_factory=dict)


def show(value, limit: int = 60) -> str:
    """A user value for an error message, cut short: bodies may hold megabytes."""
    if isinstance(value, int) and abs(value) >= 10**limit:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _get(body: dict, name: str, kinds: tuple, default=None, what: str = ""):
    value = body.get(name, default)
    if value is None:
        return default
    if bool not in kinds and isinstance(value, bool) or not isinstance(value, kinds):
        raise bad_request(f"'{name}' must be {what}, got {show(value)}", name)
    return value


def integer(body, name, default=None, lo=None, hi=None, what=None):
    value = _get(body, name, (int,), default, what or "an integer")
    if value is not None and ((lo is not None and value < lo) or (hi is not None and value > hi)):
        raise bad_request(f"'{name}' must be {what or f'between {lo} and {hi}'}, got {show(value)}", name)
    return value


def _float(body, name, default):
    value = _get(body, name, (int, float), default, "a number")
    if isinstance(value, int) and abs(value) > 2**53 or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a finite number of sensible size, got {show(value)}", name)
    return float(value)


def flag(body, name, default=False):
    return _get(body, name, (bool,), default, "true or false")


def _stop(body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request(f"'stop' must be a non-empty string or a list of them, got {show(stop)}", "stop")
    return stop


def _stop_token_ids(body) -> list[int]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise bad_request(f"'stop_token_ids' must be a list of non-negative token ids, got {show(ids)}",
                          "stop_token_ids")
    return ids


def logprob_count(body: dict, name: str, max_logprobs: int) -> int | None:
    """A logprobs count: 0..--max-logprobs, or -1 for the whole vocabulary (checked once it is known)."""
    if max_logprobs == WHOLE_VOCAB:
        return integer(body, name, None, WHOLE_VOCAB, None, "-1 (the whole vocabulary) or 0 or more")
    return integer(body, name, None, WHOLE_VOCAB, max_logprobs,
                   f"-1 (the whole vocabulary) or between 0 and {max_logprobs} (the server's --max-logprobs)")


def resolve_whole_vocab(parsed: "ParsedRequest", vocab_size: int, max_logprobs: int) -> None:
    """Make -1 (the whole vocabulary) in the request's logprob counts the vocabulary size, or 400 if the
    server's --max-logprobs is smaller."""
    params = parsed.params
    for name, param in (("logprobs", parsed.logprobs_param), ("prompt_logprobs", "prompt_logprobs")):
        if getattr(params, name) != WHOLE_VOCAB:
            continue
        if max_logprobs != WHOLE_VOCAB and vocab_size > max_logprobs:
            raise bad_request(f"'{param}': -1 asks for the logprobs of the whole vocabulary ({vocab_size} tokens) but "
                              f"this server returns at most {max_logprobs} per token (--max-logprobs); ask for fewer, "
                              f"or start the server with --max-logprobs {vocab_size} (or -1)", param)
        setattr(params, name, vocab_size)
        setattr(parsed, name, vocab_size)


def _token_ids(value, param: str) -> list[int]:
    if not value:
        raise bad_request(f"'{param}' is empty; give at least one token", param)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise bad_request(f"'{param}' must hold integers (token ids), got {show(value[:8])}", param)
    if any(t < 0 for t in value):
        raise bad_request(f"'{param}' holds negative token ids {[t for t in value if t < 0][:5]}", param)
    return list(value)


def check_token_ids(value, param: str, vocab_size: int, allow_empty: bool = False) -> list[int]:
    """A list of token ids inside the model's vocabulary (known once the model is loaded)."""
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise bad_request(f"'{param}' must be a list of token ids (integers), got {show(value)}", param)
    if not value and not allow_empty:
        raise bad_request(f"'{param}' is empty; give at least one token", param)
    bad = [t for t in value if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"'{param}' holds token ids outside the vocabulary [0, {vocab_size}): {show(bad[:5])}",
                          param)
    return value


def parse_prompts(prompt, param: str = "prompt") -> list[tuple[str | None, list[int] | None]]:
    """A string, a list of strings, a list of token ids or a list of lists of token ids (``param``: the field)."""
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request(f"'{param}' is empty; give some text or token ids", param)
        return [(prompt, None)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            if not all(prompt):
                raise bad_request(f"'{param}' holds an empty string", param)
            return [(p, None) for p in prompt]
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [(None, _token_ids(prompt, param))]
        if all(isinstance(p, list) for p in prompt):
            return [(None, _token_ids(p, param)) for p in prompt]
    raise bad_request(f"'{param}' must be a non-empty string, list of strings, list of token ids or list of "
                      "lists of token ids", param)


def _logit_bias(body: dict) -> dict[int, float] | None:
    """OpenAI's ``{"id": bias}``, or llama.cpp's ``[[id, bias], ...]``; llama.cpp's ``false`` bans the token."""
    bias = body.get("logit_bias")
    if bias is None:
        return None
    if isinstance(bias, list):
        return llama_logit_bias(bias) or None
    if not isinstance(bias, dict):
        raise bad_request("'logit_bias' must map token ids to biases, like {\"50256\": -100}, or be llama.cpp's "
                          "list of [token id, bias] pairs", "logit_bias")
    result = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise bad_request(f"'logit_bias' keys must be token ids, got {show(key)}", "logit_bias")
        result[int(key)] = ban_or_bias(value, key)
    return result or None


def _token_id_list(body: dict, name: str, most: int | None = None) -> list[int] | None:
    """vLLM's lists of token ids (logprob_token_ids, allowed_token_ids); the vocabulary is checked in the engine."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request(f"'{name}' must be a list of token ids, got {show(value)}", name)
    ids = _token_ids(value, name)
    if most is not None and len(ids) > most:
        raise bad_request(f"'{name}' holds {len(ids)} token ids; at most {most} are allowed", name)
    return ids


def _bad_words(body: dict) -> list[str]:
    words = body.get("bad_words")
    if words is None:
        return []
    if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
        raise bad_request(f"'bad_words' must be a list of words (non-blank strings), got {show(words)}", "bad_words")
    return words


def sampling_params(body: dict, default_max_tokens: int | None, logprobs: int | None,
                     prompt_logprobs: int | None = None) -> SamplingParams:
    max_tokens = integer(body, "max_completion_tokens", None, 1, None, "an integer of at least 1")
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", None, 1, None, "an integer of at least 1")
    max_tokens = llama_max_tokens(body, max_tokens, default_max_tokens)
    temperature = _float(body, "temperature", 1.0)
    penalty = _float(body, "repetition_penalty", 1.0) if body.get("repetition_penalty") is not None else None
    repetition_penalty, repetition_window = repetition(body, penalty)
    try:
        params = SamplingParams(
            n=choices(body, integer(body, "n", 1, 1, MAX_N), MAX_N), max_tokens=max_tokens,
            temperature=0.0 if temperature < GREEDY_BELOW else temperature, top_p=_float(body, "top_p", 1.0),
            top_k=integer(body, "top_k", 0, -1, None, "-1, 0 (off) or a positive integer"),
            min_p=_float(body, "min_p", 0.0), repetition_penalty=repetition_penalty,
            repetition_window=repetition_window,
            presence_penalty=_float(body, "presence_penalty", 0.0),
            frequency_penalty=_float(body, "frequency_penalty", 0.0),
            seed=integer(body, "seed", None, SEED_MIN, SEED_MAX, f"an integer in [{SEED_MIN}, {SEED_MAX}] (signed 64-bit)"),
            stop=_stop(body), stop_token_ids=_stop_token_ids(body),
            include_stop_str_in_output=flag(body, "include_stop_str_in_output"),
            ignore_eos=flag(body, "ignore_eos"), min_tokens=integer(body, "min_tokens", 0, 0),
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=flag(body, "skip_special_tokens", True), logit_bias=_logit_bias(body),
            logprob_token_ids=_token_id_list(body, "logprob_token_ids", MAX_LOGPROB_TOKEN_IDS),
            allowed_token_ids=_token_id_list(body, "allowed_token_ids"), bad_words=_bad_words(body))
    except ValueError as e:
        name = str(e).split(" ")[0]
        raise bad_request(str(e), "repeat_penalty" if name == "repetition_penalty" and penalty is None else name) from e
    check_sampler_order(body, params)
    check_penalize_nl(body, params)
    return params


def stream_options(body: dict) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats)"""
    stream = flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
    if options and not stream:                  # vLLM's rule: an empty object is tolerated
        raise bad_request("'stream_options' is only allowed with \"stream\": true", "stream_options")
    return (stream, _get(options, "include_usage", (bool,), False, "true or false"),
            _get(options, "continuous_usage_stats", (bool,), False, "true or false"))


def response_options(parsed: "ParsedRequest", body: dict, max_logprobs: int) -> "ParsedRequest":
    """The fields that shape the response or the prompt (not the sampling): vLLM's return_token_ids,
    prompt_logprobs, return_tokens_as_token_ids, truncate_prompt_tokens; the output constraint."""
    for name in ("user", "safety_identifier"):          # informational, as in OpenAI's API
        if body.get(name) is not None and not isinstance(body[name], str):
            raise bad_request(f"'{name}' must be a string, got {show(body[name])}", name)
    _metadata(body.get("metadata"))
    parsed.cache_salt = _cache_salt(body.get("cache_salt"))
    parsed.request_id = _request_id(body.get("request_id"))
    parsed.return_token_ids = flag(body, "return_token_ids")
    parsed.return_tokens_as_token_ids = flag(body, "return_tokens_as_token_ids")
    parsed.truncation = parse_truncation(body)
    parsed.prompt_logprobs = logprob_count(body, "prompt_logprobs", max_logprobs)
    if parsed.prompt_logprobs is not None:
        parsed.params.prompt_logprobs = parsed.prompt_logprobs
    found = parse_constraint(body)
    if found is not None:
        parsed.params.structured_output = found[0]
    return parsed


def _metadata(metadata) -> None:
    """OpenAI's tags for a stored completion: nothing is stored (``store`` must be false), so nothing to do once
    they are checked as OpenAI checks them."""
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > 16 or not all(
            isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()):
        raise bad_request("'metadata' must be an object of at most 16 string values (keys up to 64 characters, "
                          f"values up to 512), got {show(metadata)}", "metadata")


def _cache_salt(salt) -> str | None:
    if salt is not None and (not isinstance(salt, str) or not 1 <= len(salt) <= MAX_CACHE_SALT_CHARS):
        raise bad_request(f"'cache_salt' must be a string of 1 to {MAX_CACHE_SALT_CHARS} characters, got "
                          f"{show(salt)}", "cache_salt")
    return salt


def _request_id(request_id) -> str | None:
    """Visible ASCII only: the id is sent back in the X-Request-Id header too."""
    if request_id is None:
        return None
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_REQUEST_ID_CHARS or \
            not all("!" <= c <= "~" for c in request_id):
        raise bad_request(f"'request_id' must be 1 to {MAX_REQUEST_ID_CHARS} visible ASCII characters (no spaces), "
                          f"got {show(request_id)}", "request_id")
    return request_id


def model_name(body: dict) -> str | None:
    return _get(body, "model", (str,), None, "a string (a name from GET /v1/models)")


def unsupported(body: dict, chat: bool) -> None:
    """Known OpenAI / vLLM features this server does not implement: refuse rather than ignore them."""
    refuse_unhonoured(body, REFUSED)
    refuse_non_defaults(body)
    if not chat:
        refuse_unhonoured(body, COMPLETION_REFUSED)
    if not chat and body.get("suffix"):
        raise bad_request("'suffix' (insertion) is not supported by this server; leave it out", "suffix")
    best_of = body.get("best_of")
    if best_of is not None and best_of != body.get("n", 1):
        raise bad_request("'best_of' is not supported by this server; use 'n' (every choice is returned)", "best_of")


def check_temperature(body: dict) -> None:
    t = body.get("temperature")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and not 0 <= t <= 2:
        raise bad_request(f"'temperature' must be between 0 and 2, got {show(t)}", "temperature")


def parse_completion_request(body: dict, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> ParsedRequest:
    body = declared(body, COMPLETION, "/v1/completions")
    if "prompt" not in body:
        raise bad_request("'prompt' is required", "prompt")
    check_temperature(body)
    unsupported(body, chat=False)
    logprobs = logprob_count(body, "logprobs", max_logprobs)
    if integer(body, "n_probs", 0, 0, None, "0 or more"):
        raise bad_request("llama.cpp answers 'n_probs' on completions in the chat routes' logprobs shape "
                          "({\"content\": [...]}); this server answers OpenAI's completions shape: send 'logprobs' "
                          "with the count instead, or ask the chat route", "n_probs")
    echo = flag(body, "echo")
    stream, include_usage, continuous = stream_options(body)
    params = sampling_params(body, 16, logprobs, logprobs if echo else None)   # echo scores the prompt too
    return response_options(ParsedRequest(parse_prompts(body["prompt"]), params, stream, include_usage, echo=echo,
                                          logprobs=logprobs, model=model_name(body), continuous_usage=continuous,
                                          add_special_tokens=flag(body, "add_special_tokens", True)),
                            body, max_logprobs)
