"""The tokenizer gh200rt uses: a ``tokenizers.Tokenizer`` plus special ids and the chat template."""
from __future__ import annotations

from typing import Sequence

import tokenizers

from gh200rt.tokenizer.chat_template import render_chat


class Tokenizer:
    def __init__(self, backend: tokenizers.Tokenizer, *, bos_token: str | None = None, eos_token: str | None = None,
                 extra_eos_tokens: Sequence[str] = (), extra_eos_ids: Sequence[int] = (),
                 chat_template: str | None = None, special_tokens: dict[str, str] | None = None,
                 config: dict | None = None):
        self.backend = backend
        self.config = dict(config or {})        # tokenizer_config.json as read: what /tokenizer_info reports
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = self._id(bos_token)
        self.eos_token_id = self._id(eos_token)
        eos_ids = [] if self.eos_token_id is None else [self.eos_token_id]
        eos_ids += [i for i in (self._id(t) for t in extra_eos_tokens) if i is not None]
        eos_ids += [int(i) for i in extra_eos_ids]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_ids))
        self.chat_template = chat_template
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.special_tokens.setdefault("bos_token", bos_token or "")
        self.special_tokens.setdefault("eos_token", eos_token or "")

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a string, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]):
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False,
                            continue_final_message: bool = False, chat_template: str | None = None, **extra):
        """``chat_template``: a template to use instead of the model's; ``extra``: more template variables."""
        template = chat_template or self.chat_template
        if not template:
            raise ValueError("this model has no chat template; pass a plain prompt instead of messages")
        text = render_chat(template, messages, add_generation_prompt, self.special_tokens,
                           continue_final_message=continue_final_message, **extra)
        # the template already wrote any BOS it wants, as transformers assumes
        return self.encode(text, add_special_tokens=False) if tokenize else text
