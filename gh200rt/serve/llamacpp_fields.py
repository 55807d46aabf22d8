"""llama.cpp's own request fields on its OpenAI-compatible routes (what its server's ``params_from_json_cmpl``
reads), taken as llama.cpp takes them where gh200rt does exactly the same, else refused with a 400.

Mapped: ``n_predict`` -> max_tokens, ``n_cmpl`` -> n, ``repeat_penalty`` / ``repeat_last_n`` -> the repetition
penalty over the last N tokens of prompt and output, ``n_probs`` -> chat's top_logprobs, ``logit_bias`` as
``[[id, bias], [id, false]]``, ``samplers`` in gh200rt's order. Defaults only (``DEFAULTS_ONLY``): the value
llama.cpp defaults to (its ``common_params_sampling`` / server defaults) changes nothing here and is accepted;
another is a 400 naming the field and saying what gh200rt does instead. A field that does nothing while another is
off (``dry_base`` while ``dry_multiplier`` is 0) takes any value while it is (``GATED_BY``).
"""
from __future__ import annotations

import math

from gh200rt.serve.errors import bad_request

LLAMACPP_REPEAT_LAST_N = 64          # llama.cpp's default window of repeat_penalty (--repeat-last-n)
DRY_SEQUENCE_BREAKERS = ["\n", ":", "\"", "*"]
# gh200rt's sampler order, in llama.cpp's names; the samplers that are off here (their fields are defaults only)
# may stand anywhere in a ``samplers`` list.
SAMPLER_ORDER = ["penalties", "temperature", "top_k", "top_p", "min_p"]
OFF_SAMPLERS = ("dry", "top_n_sigma", "typ_p", "xtc")


def _default(value, what: str, name: str) -> tuple[tuple, str]:
    shown = "true" if value is True else "false" if value is False else repr(value).replace("'", '"')
    return (value,), f"{what}; leave '{name}' out or {shown}"


DEFAULTS_ONLY = {
    "typical_p": _default(1.0, "locally typical sampling is not supported by this server", "typical_p"),
    "tfs_z": _default(1.0, "tail-free sampling is not supported by this server", "tfs_z"),
    "top_n_sigma": _default(-1.0, "top-n-sigma sampling is not supported by this server", "top_n_sigma"),
    "min_keep": _default(0, "top_k, top_p and min_p here always keep at least the most likely token and have no "
                            "larger floor", "min_keep"),
    "dynatemp_range": _default(0.0, "dynamic temperature is not supported by this server", "dynatemp_range"),
    "dynatemp_exponent": _default(1.0, "dynamic temperature is not supported by this server", "dynatemp_exponent"),
    "mirostat": _default(0, "Mirostat sampling is not supported by this server; use top_p, top_k or min_p",
                         "mirostat"),
    "mirostat_tau": _default(5.0, "Mirostat sampling is not supported by this server", "mirostat_tau"),
    "mirostat_eta": _default(0.1, "Mirostat sampling is not supported by this server", "mirostat_eta"),
    "dry_multiplier": _default(0.0, "DRY repetition penalties are not supported by this server; use "
                                    "repeat_penalty or frequency_penalty", "dry_multiplier"),
    "dry_base": _default(1.75, "DRY repetition penalties are not supported by this server", "dry_base"),
    "dry_allowed_length": _default(2, "DRY repetition penalties are not supported by this server",
                                   "dry_allowed_length"),
    "dry_penalty_last_n": _default(-1, "DRY repetition penalties are not supported by this server",
                                   "dry_penalty_last_n"),
    "dry_sequence_breakers": _default(DRY_SEQUENCE_BREAKERS, "DRY repetition penalties are not supported by this "
                                                             "server", "dry_sequence_breakers"),
    "xtc_probability": _default(0.0, "XTC sampling is not supported by this server", "xtc_probability"),
    "xtc_threshold": _default(0.1, "XTC sampling is not supported by this server", "xtc_threshold"),
    "id_slot": _default(-1, "this server has no slots to choose: requests are batched together", "id_slot"),
    "n_keep": ((0, -1), "this server never shifts the context (a request ends at max_model_len), so there is "
                        "nothing to keep; leave 'n_keep' out, 0 or -1"),
    "n_discard": _default(0, "this server never shifts the context (a request ends at max_model_len)", "n_discard"),
    "n_indent": _default(0, "a minimum line indentation is not supported by this server", "n_indent"),
    "n_cache_reuse": _default(0, "the prefix cache reuses whole blocks of a matching prefix only, not shifted "
                                 "chunks", "n_cache_reuse"),
    "t_max_predict_ms": _default(0, "a time limit on generation is not supported by this server; bound it with "
                                    "'max_tokens'", "t_max_predict_ms"),
    "t_max_prompt_ms": _default(-1, "a time limit on the prompt is not supported by this server",
                                "t_max_prompt_ms"),
    "timings_per_token": _default(False, "this server returns no timings; see GET /metrics",
                                  "timings_per_token"),
    "return_progress": _default(False, "this server returns no prompt progress", "return_progress"),
    "return_tokens": _default(False, "send 'return_token_ids' (vLLM's) for the tokens' ids", "return_tokens"),
    "post_sampling_probs": _default(False, "logprobs here are those of the model's distribution before sampling",
                                    "post_sampling_probs"),
    "response_fields": ((None, []), "the OpenAI routes answer whole bodies; leave 'response_fields' out"),
    "lora": ((None, []), "a LoRA adapter is chosen by 'model' (a name from GET /v1/models) and runs at its own "
                         "scale; leave 'lora' out"),
    "image_data": ((None, []), "images are not supported by this server (text-only models); leave 'image_data' out"),
    "multimodal_data": ((None, []), "images, audio and video are not supported by this server (text-only "
                                    "models); leave 'multimodal_data' out"),
}
# field -> the field that switches its sampler off at its default (then the field changes nothing)
GATED_BY = {"dynatemp_exponent": "dynatemp_range", "mirostat_tau": "mirostat", "mirostat_eta": "mirostat",
            "dry_base": "dry_multiplier", "dry_allowed_length": "dry_multiplier",
            "dry_penalty_last_n": "dry_multiplier", "dry_sequence_breakers": "dry_multiplier",
            "xtc_threshold": "xtc_probability"}
MAPPED = ("n_predict", "n_cmpl", "repeat_penalty", "repeat_last_n", "n_probs", "samplers", "penalize_nl")
FIELDS = (*MAPPED, *DEFAULTS_ONLY)


def _is_default(body: dict, name: str) -> bool:
    value, (accepted, _) = body.get(name), DEFAULTS_ONLY[name]
    return value is None or any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in accepted)


def refuse_non_defaults(body: dict) -> None:
    """A 400 naming the first defaults-only field whose value asks for something."""
    for name in DEFAULTS_ONLY:
        if name in body and not _is_default(body, name) and not (name in GATED_BY and
                                                                  _is_default(body, GATED_BY[name])):
            raise bad_request(DEFAULTS_ONLY[name][1], name)


def _conflict(name: str, value, other: str, theirs) -> None:
    raise bad_request(f"'{name}' ({value}) and '{other}' ({theirs}) disagree; send one of them", name)


def _int(body: dict, name: str, lo: int, what: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise bad_request(f"'{name}' must be {what}, got {value!r:.60}", name)
    return value


def max_tokens(body: dict, openai: int | None, default: int | None) -> int | None:
    """max_tokens / max_completion_tokens (``openai``) or llama.cpp's n_predict (-1: until EOS or the context is
    full); both given must agree."""
    predict = _int(body, "n_predict", -1, "-1 (until EOS or the context is full) or a positive integer")
    if predict is None:
        return default if openai is None else openai
    if predict == 0:
        raise bad_request("'n_predict' 0 only evaluates the prompt into llama.cpp's cache; this server generates at "
                          "least one token: send 1 or more, or -1", "n_predict")
    limit = None if predict == -1 else predict
    if openai is not None and openai != limit:
        _conflict("n_predict", predict, "max_tokens", openai)
    return limit


def choices(body: dict, n: int, most: int) -> int:
    """vLLM's n or llama.cpp's n_cmpl (the same: that many choices per prompt)."""
    n_cmpl = _int(body, "n_cmpl", 1, f"between 1 and {most}")
    if n_cmpl is None:
        return n
    if n_cmpl > most:
        raise bad_request(f"'n_cmpl' must be between 1 and {most}, got {n_cmpl}", "n_cmpl")
    if body.get("n") is not None and n != n_cmpl:
        _conflict("n_cmpl", n_cmpl, "n", n)
    return n_cmpl


def repetition(body: dict, penalty: float | None) -> tuple[float, int | None]:
    """(repetition penalty, the window it covers: None = prompt and output whole). llama.cpp's repeat_penalty
    covers the last repeat_last_n tokens (default 64; -1 = the context, 0 = none); vLLM's repetition_penalty
    covers everything unless repeat_last_n says otherwise."""
    value = body.get("repeat_penalty")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise bad_request(f"'repeat_penalty' must be a number, got {value!r:.60}", "repeat_penalty")
    if value is not None and penalty is not None and float(value) != penalty:
        _conflict("repeat_penalty", value, "repetition_penalty", penalty)
    last_n = _int(body, "repeat_last_n", -1, "-1 (the whole context), 0 (off) or a number of tokens")
    if last_n is None:
        window = LLAMACPP_REPEAT_LAST_N if value is not None else None
    else:
        window = None if last_n == -1 else last_n
    chosen = penalty if penalty is not None else float(value) if value is not None else 1.0
    return chosen, window


def llama_logit_bias(bias) -> dict[int, float] | None:
    """llama.cpp's list form ``[[id, bias], [id, false]]`` (false bans the token) as OpenAI's map; None if ``bias``
    is not a list."""
    if not isinstance(bias, list):
        return None
    result = {}
    for entry in bias:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int)
                and not isinstance(entry[0], bool) and entry[0] >= 0):
            raise bad_request("'logit_bias' as a list holds [token id, bias] pairs (bias a number in [-100, 100] or "
                              f"false to ban the token), got {entry!r:.60}; token strings are not taken: find their "
                              "ids through POST /tokenize", "logit_bias")
        result[entry[0]] = ban_or_bias(entry[1], entry[0])
    return result


def ban_or_bias(value, token) -> float:
    """A bias in [-100, 100], or false: -inf (llama.cpp's ban)."""
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
        raise bad_request(f"'logit_bias' entries must be a token id and a bias in [-100, 100] (or false to ban it), "
                          f"got {token!r:.20}: {value!r:.20}", "logit_bias")
    return float(value)


def check_sampler_order(body: dict, params) -> None:
    """``samplers`` (llama.cpp's order of its samplers): gh200rt applies penalties, temperature, top_k, top_p,
    min_p in that order. Another order is the same only where temperature cannot change what top_p and min_p
    keep (temperature 1 or greedy, or neither set), and where a sampler left out is off."""
    samplers = body.get("samplers")
    if samplers is None:
        return
    if not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers):
        raise bad_request("'samplers' must be a list of llama.cpp's sampler names, like "
                          f"{SAMPLER_ORDER}", "samplers")
    unknown = [s for s in samplers if s not in SAMPLER_ORDER and s not in OFF_SAMPLERS]
    if unknown:
        raise bad_request(f"'samplers': {unknown[0]!r} is not a sampler this server has; it applies "
                          f"{SAMPLER_ORDER} in that order", "samplers")
    used = [s for s in samplers if s in SAMPLER_ORDER]
    active = {"penalties": params.repetition_penalty != 1.0 or bool(params.presence_penalty)
              or bool(params.frequency_penalty), "temperature": not params.greedy and params.temperature != 1.0,
              "top_k": bool(params.top_k), "top_p": params.top_p < 1.0, "min_p": params.min_p > 0.0}
    left_out = [s for s in SAMPLER_ORDER if s not in used and active[s]]
    if left_out or len(set(used)) != len(used):
        raise bad_request(f"'samplers' leaves out or repeats {left_out[0] if left_out else used}, which this "
                          f"request sets; this server applies {SAMPLER_ORDER} in that order", "samplers")
    if active["penalties"] and used.index("penalties") != min(used.index(s) for s in used if active[s]):
        raise bad_request(f"'samplers' applies the penalties after another sampler; this server applies "
                          f"{SAMPLER_ORDER} in that order: send that order or leave 'samplers' out", "samplers")
    order_matters = active["temperature"] and (active["top_p"] or active["min_p"])
    if order_matters and used.index("temperature") > min(used.index(s) for s in ("top_p", "min_p") if s in used):
        raise bad_request(f"'samplers' applies temperature after top_p/min_p; this server applies {SAMPLER_ORDER} in "
                          "that order (vLLM's), so top_p and min_p see the tempered distribution: send that order, "
                          "leave 'samplers' out, or set temperature 1", "samplers")


def check_penalize_nl(body: dict, params) -> None:
    """llama.cpp's penalize_nl (dropped by llama.cpp since, which now penalises newlines like any token, as this
    server does): false can be honoured only where no penalty applies."""
    value = body.get("penalize_nl")
    if value is None or value is True:
        return
    if value is not False:
        raise bad_request(f"'penalize_nl' must be true or false, got {value!r:.60}", "penalize_nl")
    if params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
        raise bad_request("'penalize_nl' false keeps newlines out of the penalties; this server penalises them like "
                          "any token: leave 'penalize_nl' out or true", "penalize_nl")
