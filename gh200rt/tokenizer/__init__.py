"""Tokenizers and chat templates: ``Tokenizer`` over the ``tokenizers`` library, built from an HF
directory (``from_hf_dir``) or GGUF metadata (``from_gguf_metadata``)."""
from gh200rt.tokenizer.tokenizer import Tokenizer

__all__ = ["Tokenizer"]
