"""Random EAGLE-3 heads in the published checkpoint format (config.json + model.safetensors or pytorch_model.bin,
``midlayer.*`` names, ``d2t`` / ``t2d``), and a plain-torch reference of what a head drafts, computed from scratch
from transformers' hidden states of the target."""
from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F


def write_eagle3_head(path: str, hidden: int = 64, heads: int = 4, kv_heads: int = 2, intermediate: int = 96,
                      vocab: int = 256, draft_vocab: int = 200, aux_ids: list[int] | None = None, seed: int = 0,
                      own_embed: bool = False, weights: str = "model.safetensors", extra: dict | None = None) -> str:
    """A head for a target of ``hidden`` width and ``vocab`` tokens; its draft vocabulary is ``draft_vocab`` target
    ids chosen at random (kept in order, as the published maps are)."""
    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    head_dim = hidden // heads

    def rand(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    def norm(size):
        return 1.0 + 0.1 * torch.randn(size, generator=g)

    tensors = {
        "fc.weight": rand(hidden, 3 * hidden, scale=0.05),
        "midlayer.input_layernorm.weight": norm(hidden),
        "midlayer.hidden_norm.weight": norm(hidden),
        "midlayer.post_attention_layernorm.weight": norm(hidden),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(intermediate, hidden),
        "midlayer.mlp.up_proj.weight": rand(intermediate, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, intermediate),
        "norm.weight": norm(hidden),
        "lm_head.weight": rand(draft_vocab, hidden, scale=0.3),
    }
    chosen = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
    tensors["d2t"] = chosen - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    tensors["t2d"] = t2d
    if own_embed:
        tensors["embed_tokens.weight"] = rand(vocab, hidden, scale=0.5)
    if weights.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, weights))
    else:
        torch.save(tensors, os.path.join(path, weights))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
              "vocab_size": vocab, "draft_vocab_size": draft_vocab, "tie_word_embeddings": False,
              "torch_dtype": "float32", **(extra or {})}
    if aux_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids, "use_aux_hidden_state": True}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


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
