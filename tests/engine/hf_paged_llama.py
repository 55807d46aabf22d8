"""transformers' Llama weights driven through the gh200rt model contract with paged KV in torch.

Used by the engine tests to check the engine on real weights independently of gh200rt's own
model code: every projection, norm, MLP and rotary embedding is transformers' module; only the
attention reads K/V through the block tables (one sequence at a time, exact fp32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tests.engine.arch_doubles import HeadsKvLayout


@dataclass
class HFArch(HeadsKvLayout):
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int


class HFPagedLlama(torch.nn.Module):
    def __init__(self, hf_model):
        super().__init__()
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        self.hf = hf_model.eval()
        self.rope = apply_rotary_pos_emb
        c = hf_model.config
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.arch = HFArch(c.num_hidden_layers, self.kv_heads, self.head_dim, c.vocab_size,
                           c.max_position_embeddings)

    @torch.inference_mode()
    def forward(self, input_ids, positions, meta, kv_caches):
        m = self.hf.model
        x = m.embed_tokens(input_ids)[None]
        cos, sin = m.rotary_emb(x, positions[None])
        T = input_ids.shape[0]
        for layer, cache in zip(m.layers, kv_caches):
            h = layer.input_layernorm(x)
            att = layer.self_attn
            q = att.q_proj(h).view(1, T, self.heads, self.head_dim).transpose(1, 2)
            k = att.k_proj(h).view(1, T, self.kv_heads, self.head_dim).transpose(1, 2)
            v = att.v_proj(h).view(1, T, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            flat = cache.view(2, -1, self.kv_heads, self.head_dim)
            flat[0, meta.slot_mapping] = k[0].transpose(0, 1)
            flat[1, meta.slot_mapping] = v[0].transpose(0, 1)
            out = self._attend(q[0].transpose(0, 1), flat, meta)
            x = x + att.o_proj(out.reshape(1, T, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return m.norm(x)[0]

    def _attend(self, q, flat, meta):
        bs, group = meta.block_size, self.heads // self.kv_heads
        out = torch.empty_like(q)
        for b, (ql, sl) in enumerate(zip(meta.query_lens_list, meta.seq_lens_list)):
            start = int(meta.query_start_loc[b])
            table = meta.block_tables[b, : -(-sl // bs)].long()
            slots = (table[:, None] * bs + torch.arange(bs)).reshape(-1)[:sl]
            k = flat[0, slots].repeat_interleave(group, dim=1).transpose(0, 1)     # [H, S, D]
            v = flat[1, slots].repeat_interleave(group, dim=1).transpose(0, 1)
            qb = q[start:start + ql].transpose(0, 1)                                 # [H, Q, D]
            scores = qb @ k.transpose(1, 2) / self.head_dim ** 0.5
            causal = torch.arange(sl)[None, :] > torch.arange(sl - ql, sl)[:, None]
            scores = scores.masked_fill(causal, float("-inf"))
            out[start:start + ql] = (torch.softmax(scores, -1) @ v).transpose(0, 1)
        return out

    @torch.inference_mode()
    def compute_logits(self, hidden):
        return self.hf.lm_head(hidden).float()


class HFTokenizer:
    """transformers tokenizer behind the small interface the engine uses."""

    def __init__(self, tok):
        self.tok = tok
        self.eos_token_ids = [tok.eos_token_id] if tok.eos_token_id is not None else []

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def load_hf_paged(model: str):
    """(HFPagedLlama, HFTokenizer) for a Hugging Face directory or a GGUF file, fp32."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer
    kw = {}
    if model.endswith(".gguf"):
        kw = {"gguf_file": os.path.basename(model)}
        model = os.path.dirname(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, **kw)
    return HFPagedLlama(hf), HFTokenizer(AutoTokenizer.from_pretrained(model, **kw))
