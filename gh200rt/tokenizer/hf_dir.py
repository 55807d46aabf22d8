"""Tokenizer of a Hugging Face model directory: tokenizer.json, tokenizer_config.json, chat_template.jinja,
and the eos ids of generation_config.json / config.json."""
from __future__ import annotations

import json
import os

import tokenizers

from gh200rt.tokenizer.tokenizer import Tokenizer

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _chat_template(directory: str, tokenizer_config: dict) -> str | None:
    jinja_path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: use "default"
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def tokenizer_from_hf_dir(directory: str) -> Tokenizer:
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        raise ValueError(f"model directory {directory} has no tokenizer.json; gh200rt needs the fast-tokenizer file")
    try:
        backend = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # the tokenizers library raises plain Exceptions for malformed files
        raise ValueError(f"{path} could not be read as a tokenizer: {e}") from e
    config = _read_json(os.path.join(directory, "tokenizer_config.json"))
    specials = {key: _token_text(config.get(key)) for key in _SPECIAL_KEYS}
    eos_ids = (_ids(_read_json(os.path.join(directory, "generation_config.json")).get("eos_token_id"))
               + _ids(_read_json(os.path.join(directory, "config.json")).get("eos_token_id")))
    return Tokenizer(backend, bos_token=specials["bos_token"], eos_token=specials["eos_token"],
                     extra_eos_ids=eos_ids, chat_template=_chat_template(directory, config), special_tokens=specials,
                     config=config)
