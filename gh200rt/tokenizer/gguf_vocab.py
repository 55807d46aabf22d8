"""Tokenizer from GGUF metadata (``tokenizer.ggml.*``), built as transformers' GGUF conversion builds it.

Only byte-level BPE (``tokenizer.ggml.model == "gpt2"``) is supported: the GPT-2 layout (BPE over the
byte alphabet, ByteLevel pre-tokenizer and decoder), control tokens (type 3) added whole as special
tokens, user-defined tokens (type 4) as plain added tokens, and the split regex that
``tokenizer.ggml.pre`` names when it names one transformers knows.
"""
from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from gh200rt.tokenizer.tokenizer import Tokenizer

CONTROL, USER_DEFINED = 3, 4
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {name: _LLAMA3_SPLIT for name in (
    "llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe")}
PRE_TOKENIZER_SPLITS.update({name: _QWEN2_SPLIT for name in ("qwen2", "deepseek-r1-qwen")})


def _bytes_to_unicode() -> dict[int, str]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def tokenizer_from_gguf_metadata(meta: dict) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer type {kind!r} is not supported; gh200rt reads byte-level BPE ('gpt2') "
                         f"vocabularies. Use the model's Hugging Face directory instead")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    token_types = list(meta.get("tokenizer.ggml.token_type") or [])
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {}
    for index, token in enumerate(tokens):
        spelled = token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8"))
        vocab[spelled] = index
    merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges") or []]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                 end_of_word_suffix="", fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()

    def token_at(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None

    specials = {"bos_token": token_at("bos_token_id"), "eos_token": token_at("eos_token_id"),
                "unk_token": token_at("unknown_token_id"), "pad_token": token_at("padding_token_id")}
    control = [t for t, kind in zip(tokens, token_types) if kind == CONTROL and set(t) <= alphabet]
    control += [t for t in specials.values() if t is not None and t not in control]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, kind in zip(tokens, token_types) if kind == USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return Tokenizer(backend, bos_token=specials["bos_token"], eos_token=specials["eos_token"],
                     chat_template=meta.get("tokenizer.chat_template"), special_tokens=specials)
