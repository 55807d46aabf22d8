"""Random EAGLE-3 heads in the published checkpoint format (``write_eagle3_head``: the tiny targets' sizes by
default), and a plain-torch reference of what a head drafts, computed from scratch
from transformers' hidden states of the target."""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from gh200rt.bench.random_heads import write_random_eagle3_head as write_eagle3_head  # noqa: F401 (tiny sizes)


def _rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, positions, theta=10000.0):
    """Llama's rotary embedding (halves rotated), x: [T, heads, D]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * inv[None]
    cos = torch.cat([angles.cos(), angles.cos()], -1).float()[:, None]
    sin = torch.cat([angles.sin(), angles.sin()], -1).float()[:, None]
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + half * sin


class ReferenceHead:
    """What an EAGLE-3 head drafts after a sequence's tokens, recomputed from scratch: the target's hidden states
    from transformers, the head's layer with causal attention over every position from 0."""

    def __init__(self, head_path: str, target_path: str, aux_ids: tuple[int, ...], heads: int = 4,
                 kv_heads: int = 2):
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM
        self.w = load_file(os.path.join(head_path, "model.safetensors"))
        self.target = AutoModelForCausalLM.from_pretrained(target_path, torch_dtype=torch.float32).eval()
        self.embed = self.w.get("embed_tokens.weight", self.target.model.embed_tokens.weight.detach())
        self.aux_ids, self.heads, self.kv_heads = aux_ids, heads, kv_heads
        self.targets = torch.arange(len(self.w["d2t"])) + self.w["d2t"]

    def _layer(self, tokens: torch.Tensor, hidden: torch.Tensor):
        """(logits over the target vocabulary of every row, the layer's output) for rows at positions 0..T-1."""
        w = self.w
        t = tokens.shape[0]
        both = torch.cat([_rms(self.embed[tokens], w["midlayer.input_layernorm.weight"]),
                          _rms(hidden, w["midlayer.hidden_norm.weight"])], -1)
        d = hidden.shape[-1] // self.heads
        q = (both @ w["midlayer.self_attn.q_proj.weight"].T).view(t, self.heads, d)
        k = (both @ w["midlayer.self_attn.k_proj.weight"].T).view(t, self.kv_heads, d)
        v = (both @ w["midlayer.self_attn.v_proj.weight"].T).view(t, self.kv_heads, d)
        positions = torch.arange(t)
        q, k = _rope(q, positions), _rope(k, positions)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             is_causal=True).transpose(0, 1).reshape(t, -1)
        residual = hidden + att @ w["midlayer.self_attn.o_proj.weight"].T
        x = _rms(residual, w["midlayer.post_attention_layernorm.weight"])
        mlp = (F.silu(x @ w["midlayer.mlp.gate_proj.weight"].T) * (x @ w["midlayer.mlp.up_proj.weight"].T)) \
            @ w["midlayer.mlp.down_proj.weight"].T
        out = residual + mlp
        draft = _rms(out, w["norm.weight"]) @ w["lm_head.weight"].T
        full = torch.full((t, self.embed.shape[0]), float("-inf"))
        full[:, self.targets] = draft
        return full, out

    @torch.no_grad()
    def drafts(self, token_ids: list[int], k: int) -> list[torch.Tensor]:
        """The logits of each of the k drafts after ``token_ids`` (greedy chain)."""
        ids = torch.tensor(token_ids)
        states = self.target(ids[None, :-1], output_hidden_states=True).hidden_states
        captured = torch.cat([states[i][0] for i in self.aux_ids], -1)
        hidden = captured @ self.w["fc.weight"].T
        tokens = ids[1:]
        out = []
        for _ in range(k):
            logits, carried = self._layer(tokens, hidden)
            out.append(logits[-1])
            tokens = torch.cat([tokens, logits[-1].argmax()[None]])
            hidden = torch.cat([hidden, carried[-1:]])
        return out
