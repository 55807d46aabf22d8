"""What ``/tokenizer_info`` and ``/tokenize``'s ``token_strs`` say about the model's tokenizer, in vLLM's
shape: the tokenizer's configuration (tokenizer_config.json without file paths) with ``tokenizer_class``
and the chat template, and each token id's vocabulary string."""
from __future__ import annotations

FILE_KEYS = ("vocab_file", "merges_file", "tokenizer_file")


def tokenizer_info(tok) -> dict:
    info = {k: v for k, v in (getattr(tok, "config", None) or {}).items() if k not in FILE_KEYS}
    for name, text in (getattr(tok, "special_tokens", None) or {}).items():   # a GGUF tokenizer has no config file
        info.setdefault(name, text)
    info["tokenizer_class"] = info.get("tokenizer_class") or type(tok).__name__
    template = getattr(tok, "chat_template", None)
    if template:
        info["chat_template"] = template
    return info


def token_strings(tok, ids: list[int]) -> list[str]:
    """The vocabulary entry of each id (e.g. "Ġworld"), as transformers' convert_ids_to_tokens gives it."""
    if hasattr(tok, "convert_ids_to_tokens"):
        return list(tok.convert_ids_to_tokens(ids))
    return [tok.decode([i], skip_special_tokens=False) for i in ids]
