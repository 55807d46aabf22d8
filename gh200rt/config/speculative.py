"""``SpeculativeConfig``: speculative decoding, set with vLLM's ``--speculative-config`` JSON (docs/SPECULATIVE.md).

The flag (or ``LLM(speculative_config=...)``, a dict or its JSON) is read into ``SpeculativeMethod``: every key vLLM
documents that gh200rt honours is taken, every other key is refused with the list of those it knows, so a setting is
never accepted and then ignored.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help

# vLLM's method names; the built ones first. ``mtp`` is for models that ship multi-token-prediction layers.
BUILT_METHODS = ("ngram", "suffix", "draft_model", "eagle3", "mtp")
MODEL_METHODS = ("draft_model", "eagle3", "mtp")     # those that read "model" (mtp: the target's checkpoint)
SUFFIX_KEYS = ("suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
               "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")
KNOWN_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model",
              "draft_tensor_parallel_size", "disable_by_batch_size", *SUFFIX_KEYS)
SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
                   "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}   # vLLM's
NGRAM_DEFAULT_LOOKUP = 5           # vLLM's prompt_lookup_min / _max when neither is given
AUTO_MAX_K = 8                     # num_speculative_tokens "auto": k chosen per step in 0..this (speculative/auto_k.py)


@dataclass(frozen=True)
class SpeculativeMethod:
    """One ``--speculative-config``, read and checked."""
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = NGRAM_DEFAULT_LOOKUP
    prompt_lookup_max: int = NGRAM_DEFAULT_LOOKUP
    model: str | None = None
    # drafting stops while this many requests or more are running (vLLM's key); None: always drafts
    disable_by_batch_size: int | None = None
    # num_speculative_tokens "auto": each step's k chosen in 0..num_speculative_tokens from the measured acceptance
    # and step costs
    auto_k: bool = False
    # suffix: the trees' depth, the finished requests the global tree keeps, the draft's length per matched token
    # and the least share of its parent's occurrences a drafted token must have (speculative/suffix.py)
    suffix_max_tree_depth: int = 24
    suffix_max_cached_requests: int = 10000
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1

    def describe(self) -> str:
        if self.method == "ngram":
            where = f", lookup {self.prompt_lookup_min}-{self.prompt_lookup_max} tokens"
        elif self.method == "suffix":
            where = (f", trees {self.suffix_max_tree_depth} tokens deep over the request and the latest "
                     f"{self.suffix_max_cached_requests} outputs")
        elif self.method == "eagle3":
            where = f", head {self.model}"
        elif self.method == "mtp":
            where = ", the checkpoint's multi-token-prediction layer"
        else:
            where = f", draft {self.model}"
        k = f"auto (0-{self.num_speculative_tokens} per step, from the measured acceptance and step costs)" \
            if self.auto_k else str(self.num_speculative_tokens)
        return f"{self.method}, k={k}{where}"


def _float_key(values: dict, key: str, low: float, high: float | None) -> float:
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or \
            (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"--speculative-config: {key} must be a number {bound}, got {value!r}")
    return float(value)


def _int_key(values: dict, key: str, minimum: int, default: int | None = None) -> int | None:
    value = values.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"--speculative-config: {key} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"--speculative-config: {key} must be at least {minimum}, got {value}")
    return value


def read_speculative_config(text: str | dict) -> SpeculativeMethod:
    """``text`` (JSON, or a dict) -> ``SpeculativeMethod``; ``ValueError`` that says what to write otherwise."""
    if isinstance(text, dict):
        values = dict(text)
    else:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--speculative-config is not JSON ({e.msg}); write e.g. "
                             "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'") from None
        if not isinstance(values, dict):
            raise ValueError("--speculative-config must be a JSON object such as "
                             "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    unknown = sorted(set(values) - set(KNOWN_KEYS))
    if unknown:
        raise ValueError(f"--speculative-config: {', '.join(unknown)} not supported; the keys gh200rt reads are "
                         f"{', '.join(KNOWN_KEYS)}")
    method = values.get("method")
    if method is None:             # vLLM infers it from "model": "ngram" is the n-gram proposer, a path a draft model
        model = values.get("model")
        method = "ngram" if model in ("ngram", "[ngram]") else ("draft_model" if model else None)
        if method == "ngram":
            values.pop("model")
    if method == "[ngram]":
        method = "ngram"
    if method is None:
        raise ValueError("--speculative-config needs \"method\" (ngram, suffix, draft_model, eagle3 or mtp), e.g. "
                         "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    if method not in BUILT_METHODS:
        raise ValueError(f"--speculative-config: unknown method {method!r}; choose one of "
                         f"{', '.join(BUILT_METHODS)}")
    suffix_given = sorted(set(values) & set(SUFFIX_KEYS))
    if suffix_given and method != "suffix":
        raise ValueError(f"--speculative-config: {', '.join(suffix_given)} set the suffix method's trees; drop them "
                         f"or use \"method\": \"suffix\"")
    lookup_given = sorted(set(values) & {"prompt_lookup_min", "prompt_lookup_max"})
    if lookup_given and method != "ngram":
        raise ValueError(f"--speculative-config: {', '.join(lookup_given)} set prompt lookup (method ngram); drop "
                         f"them for method {method}")
    suffix = {**SUFFIX_DEFAULTS, **{key: values[key] for key in suffix_given}}
    depth = _int_key(suffix, "suffix_decoding_max_tree_depth", 1)
    cached = _int_key(suffix, "suffix_decoding_max_cached_requests", 0)
    factor = _float_key(suffix, "suffix_decoding_max_spec_factor", 0.0, None)
    least = _float_key(suffix, "suffix_decoding_min_token_prob", 0.0, 1.0)
    if method == "suffix" and values.get("num_speculative_tokens") is None:
        values["num_speculative_tokens"] = depth       # vLLM's default for the method: as deep as the trees
    k = values.get("num_speculative_tokens")
    if k is None:
        raise ValueError("--speculative-config needs num_speculative_tokens (drafted tokens per step, e.g. 4)")
    auto = k == "auto"
    k = AUTO_MAX_K if auto else _int_key(values, "num_speculative_tokens", 0)
    if values.get("model") is not None and method in ("ngram", "suffix"):
        raise ValueError(f"--speculative-config: method {method} drafts from the prompt and outputs; drop \"model\"")
    if method == "draft_model" and not values.get("model"):
        raise ValueError("--speculative-config: method draft_model needs \"model\": the draft's Hugging Face "
                         "directory, .gguf file or alias")
    if method == "eagle3" and not values.get("model"):
        raise ValueError("--speculative-config: method eagle3 needs \"model\": the directory of an EAGLE-3 head "
                         "trained for the target (config.json and its weights)")
    tp = _int_key(values, "draft_tensor_parallel_size", 1)
    if tp not in (None, 1):
        raise ValueError(f"--speculative-config: draft_tensor_parallel_size {tp}: the draft runs unsharded beside "
                         f"the target (on rank 0 with tensor parallelism); drop the key or set it to 1")
    low = _int_key(values, "prompt_lookup_min", 1)
    high = _int_key(values, "prompt_lookup_max", 1)
    low, high = (low or high or NGRAM_DEFAULT_LOOKUP), (high or low or NGRAM_DEFAULT_LOOKUP)
    if low > high:
        raise ValueError(f"--speculative-config: prompt_lookup_min ({low}) is larger than prompt_lookup_max ({high})")
    return SpeculativeMethod(method, k, low, high, values.get("model") if method in MODEL_METHODS else None,
                             _int_key(values, "disable_by_batch_size", 1), auto_k=auto, suffix_max_tree_depth=depth,
                             suffix_max_cached_requests=cached, suffix_max_spec_factor=factor,
                             suffix_min_token_prob=least)


@dataclass(frozen=True)
class SpeculativeConfig:
    speculative_config: str | None = field(default=None, metadata=flag_help(
        "speculative decoding, as vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
        "\"prompt_lookup_max\": 4}' drafts the tokens that followed the latest earlier occurrence of the output's "
        "last 1-4 tokens (prompt lookup) and verifies them in one step; off unless given"))

    def __post_init__(self):
        if isinstance(self.speculative_config, dict):     # LLM(speculative_config={...}): kept as its JSON
            object.__setattr__(self, "speculative_config", json.dumps(self.speculative_config))
        self.method    # noqa: B018 -- read once here, so a bad value is refused at start-up

    @property
    def method(self) -> SpeculativeMethod | None:
        """The settings read from the flag; None when speculative decoding is off (or k is 0)."""
        if self.speculative_config is None:
            return None
        method = read_speculative_config(self.speculative_config)
        return method if method.num_speculative_tokens > 0 else None
