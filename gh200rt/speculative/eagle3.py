"""The ``eagle3`` method's draft: an EAGLE-3 head in its published checkpoint format.

A head is one Llama decoder layer that drafts from the target's own hidden states. The target returns, for every
position it computes, the hidden states entering three of its layers (``capture_layers``: the config's
``eagle_config.eagle_aux_hidden_state_layer_ids``, by default layers 2, L/2 and L-3 as the heads were trained);
``fc`` folds the three into one. At position p the head takes that hidden state and the token at p + 1, normalises
each (``hidden_norm``, ``input_layernorm``) and feeds the two side by side to its attention (q/k/v read 2H
columns); the layer's output (before ``norm``) is what its next draft step takes in place of the target's hidden
state. Its LM head covers ``draft_vocab_size`` tokens, each mapped to a target id by ``d2t`` (target = draft id +
d2t[draft id]); every other target id gets no probability from the draft.

Files: ``config.json`` (``architectures`` ``LlamaForCausalLMEagle3``, the layer's sizes, ``vocab_size`` the target's,
``draft_vocab_size``) and ``model.safetensors`` or ``pytorch_model.bin`` (read with ``weights_only``) holding
``fc.weight``, ``midlayer.*`` (or ``layers.0.*``), ``norm.weight``, ``lm_head.weight``, ``d2t`` (and ``t2d``,
unused), and ``embed_tokens.weight`` only where the head does not share the target's embeddings. Every tensor is
checked for its name and shape; nothing is fetched.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.models.layers.linear import RefLinear
from gh200rt.models.layers.mlp import GatedMLP
from gh200rt.models.layers.rmsnorm import RMSNorm
from gh200rt.models.layers.rotary import RotaryEmbedding

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
# target families whose decoder stack a head reads (the Llama decoder: Llama, Mistral, Qwen2/3 and their MoE forms)
TARGETS = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class Eagle3Config:
    arch: ArchConfig               # the head's one layer (vocab_size: the target's)
    draft_vocab_size: int
    target_hidden_size: int
    capture_layers: tuple[int, ...]   # target layers whose input hidden states the head reads, in fc's order


def default_capture_layers(num_layers: int) -> tuple[int, ...]:
    """The layers EAGLE-3 heads are trained on: an early, a middle and a late one."""
    return 2, num_layers // 2, num_layers - 3


def read_eagle3_config(path: str, target: ArchConfig) -> Eagle3Config:
    """``path``'s config.json, checked against the target; ``ValueError`` that says what is wrong."""
    where = f"--speculative-config: the eagle3 head {path}"
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ValueError(f"{where} has no config.json; give the directory of an EAGLE-3 head "
                         f"(config.json and {' or '.join(WEIGHT_FILES)})")
    with open(config_path) as f:
        cfg = json.load(f)
    archs = cfg.get("architectures") or []
    if not any(a in ARCHITECTURES for a in archs):
        raise ValueError(f"{where} declares architectures {archs}; gh200rt reads EAGLE-3 heads "
                         f"({', '.join(ARCHITECTURES)}); EAGLE-1/2 heads and other draft formats are not supported")
    if target.architecture not in TARGETS or target.is_mla:
        raise ValueError(f"--speculative-config: method eagle3 drafts for targets of the Llama decoder "
                         f"({', '.join(TARGETS)}); this target is {target.architecture}"
                         + ("; use method mtp for a model that ships multi-token-prediction layers"
                            if target.is_mla else "; use ngram, suffix or draft_model"))
    layers = int(cfg.get("num_hidden_layers", 1))
    if layers != 1:
        raise ValueError(f"{where} has {layers} decoder layers; an EAGLE-3 head has one")
    if int(cfg["vocab_size"]) != target.vocab_size:
        raise ValueError(f"{where} was trained for a vocabulary of {cfg['vocab_size']} tokens, the target has "
                         f"{target.vocab_size}; use a head trained for this target")
    target_hidden = int(cfg.get("target_hidden_size") or cfg["hidden_size"])
    if target_hidden != target.hidden_size:
        raise ValueError(f"{where} reads hidden states of width {target_hidden}, the target's are "
                         f"{target.hidden_size}; use a head trained for this target")
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    capture = tuple(int(i) for i in ids) if ids else default_capture_layers(target.num_layers)
    if len(capture) != 3 or not all(0 <= i < target.num_layers for i in capture):
        raise ValueError(f"{where} reads the hidden states entering layers {list(capture)}, the target has "
                         f"{target.num_layers} layers; an EAGLE-3 head reads three of them (set "
                         f"eagle_config.eagle_aux_hidden_state_layer_ids in its config.json)")
    head_arch = ArchConfig.from_hf_config({**cfg, "model_type": "llama", "num_hidden_layers": 1,
                                           "max_position_embeddings": max(int(cfg.get("max_position_embeddings",
                                                                                      2048)),
                                                                          target.max_position_embeddings)})
    draft_vocab = int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
    if not 0 < draft_vocab <= target.vocab_size:
        raise ValueError(f"{where}: draft_vocab_size {draft_vocab} must be between 1 and the target's "
                         f"{target.vocab_size}")
    return Eagle3Config(head_arch, draft_vocab, target_hidden, capture)


class Eagle3Head(nn.Module):
    """The head's modules; ``embed_tokens`` is the target's unless the checkpoint has its own."""

    def __init__(self, config: Eagle3Config, target_embed: torch.Tensor, dtype: torch.dtype, device):
        super().__init__()
        a = config.arch
        h = a.hidden_size
        self.config = config
        self.arch = a
        self.capture_layers = config.capture_layers
        self.embed_tokens = target_embed
        self.fc = RefLinear(3 * config.target_hidden_size, h, False, dtype, device)
        self.input_layernorm = RMSNorm(h, a.rms_norm_eps, dtype, device)
        self.hidden_norm = RMSNorm(h, a.rms_norm_eps, dtype, device)
        self.self_attn = SelfAttention(a, dtype, device)
        self.self_attn.qkv_proj = RefLinear(2 * h, a.q_size + 2 * a.kv_size, a.attention_bias, dtype, device)
        self.post_attention_layernorm = RMSNorm(h, a.rms_norm_eps, dtype, device)
        self.mlp = GatedMLP(h, a.intermediate_size, dtype, device)
        self.norm = RMSNorm(h, a.rms_norm_eps, dtype, device)
        self.lm_head = RefLinear(h, config.draft_vocab_size, False, dtype, device)
        self.rotary = RotaryEmbedding(a.rope_dim, a.max_position_embeddings, a.rope_theta, a.rope_scaling, device)
        self.register_buffer("target_ids", torch.arange(config.draft_vocab_size, device=device))
        self.remap = config.draft_vocab_size != a.vocab_size     # draft ids differ from the target's (set at load)

    def combine(self, captured: torch.Tensor) -> torch.Tensor:
        """The target's three hidden states of a row -> the one the layer reads."""
        return self.fc(captured)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                meta: AttentionMetadata, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(normed, carried)``: the rows' final hidden states (for ``compute_logits``) and the layer's output, which
        the next draft step reads as its ``hidden``."""
        embeds = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rotary.tables(positions, embeds.dtype)
        both = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attended = self.self_attn(both, cos, sin, meta, kv_cache)
        normed, residual = self.post_attention_layernorm.add_and_norm(attended, hidden)
        normed, carried = self.norm.add_and_norm(self.mlp(normed), residual)
        return normed, carried

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary (float32): the head's tokens at their target ids, -inf elsewhere."""
        draft = self.lm_head(normed).float()
        if not self.remap:
            return draft
        full = draft.new_full((draft.shape[0], self.arch.vocab_size), float("-inf"))
        full[:, self.target_ids] = draft
        return full

    def destinations(self) -> dict[str, torch.Tensor]:
        """Checkpoint name (``midlayer.`` form) -> where it is copied."""
        a = self.arch
        qkv = self.self_attn.qkv_proj.weight_ref.current
        gate_up = self.mlp.gate_up_proj.weight_ref.current
        rows = gate_up.shape[0] // 2
        layer = {
            "input_layernorm.weight": self.input_layernorm.weight.data,
            "hidden_norm.weight": self.hidden_norm.weight.data,
            "post_attention_layernorm.weight": self.post_attention_layernorm.weight.data,
            "self_attn.q_proj.weight": qkv[:a.q_size],
            "self_attn.k_proj.weight": qkv[a.q_size:a.q_size + a.kv_size],
            "self_attn.v_proj.weight": qkv[a.q_size + a.kv_size:],
            "self_attn.o_proj.weight": self.self_attn.o_proj.weight_ref.current,
            "mlp.gate_proj.weight": gate_up[:rows],
            "mlp.up_proj.weight": gate_up[rows:],
            "mlp.down_proj.weight": self.mlp.down_proj.weight_ref.current,
        }
        return {"fc.weight": self.fc.weight_ref.current, "norm.weight": self.norm.weight.data,
                "lm_head.weight": self.lm_head.weight_ref.current,
                **{f"midlayer.{name}": t for name, t in layer.items()}}


def _read_tensors(path: str) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file
            return load_file(file)
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    raise ValueError(f"--speculative-config: the eagle3 head {path} has none of {', '.join(WEIGHT_FILES)}")


def load_eagle3(path: str, target_embed: Callable[[], torch.Tensor], target: ArchConfig, dtype: torch.dtype,
                device: str) -> Eagle3Head:
    """The head at ``path`` for the target ``target`` describes, its weights copied strictly (every tensor known and
    of its shape, none missing); ``target_embed()``: the target's whole embedding matrix, asked for where the head
    shares it."""
    config = read_eagle3_config(path, target)
    tensors = _read_tensors(path)
    tensors = {name.replace("layers.0.", "midlayer.", 1) if name.startswith("layers.0.") else name: t
               for name, t in tensors.items()}
    embed = tensors.pop("embed_tokens.weight", None)
    head = Eagle3Head(config, target_embed() if embed is None else
                      nn.Parameter(torch.empty(tuple(embed.shape), dtype=dtype, device=device), requires_grad=False),
                      dtype, device)
    where = f"--speculative-config: the eagle3 head {path}"
    if embed is not None:
        if tuple(embed.shape) != (target.vocab_size, config.arch.hidden_size):
            raise ValueError(f"{where}: embed_tokens.weight has shape {tuple(embed.shape)}, expected "
                             f"{(target.vocab_size, config.arch.hidden_size)}")
        head.embed_tokens.data.copy_(embed)
    d2t = tensors.pop("d2t", None)
    tensors.pop("t2d", None)
    if d2t is None and config.draft_vocab_size != target.vocab_size:
        raise ValueError(f"{where} has a draft vocabulary of {config.draft_vocab_size} tokens but no d2t map to the "
                         f"target's ids")
    if d2t is not None:
        if tuple(d2t.shape) != (config.draft_vocab_size,):
            raise ValueError(f"{where}: d2t has shape {tuple(d2t.shape)}, expected ({config.draft_vocab_size},)")
        ids = torch.arange(config.draft_vocab_size) + d2t.long()
        if int(ids.min()) < 0 or int(ids.max()) >= target.vocab_size or len(set(ids.tolist())) != len(ids):
            raise ValueError(f"{where}: d2t maps draft ids outside the target's {target.vocab_size} ids, or two "
                             f"draft ids to one")
        head.target_ids.copy_(ids)
        head.remap = head.remap or not torch.equal(ids, torch.arange(config.draft_vocab_size))
    dest = head.destinations()
    unknown = sorted(set(tensors) - set(dest))
    missing = sorted(set(dest) - set(tensors))
    if unknown or missing:
        raise ValueError(f"{where}: " + "; ".join(part for part in (
            f"unexpected tensors {', '.join(unknown[:6])}" if unknown else "",
            f"missing tensors {', '.join(missing[:6])}" if missing else "") if part)
            + " (an EAGLE-3 head holds fc, midlayer.*, norm, lm_head and d2t)")
    for name, target_tensor in dest.items():
        got = tensors[name]
        if tuple(got.shape) != tuple(target_tensor.shape):
            raise ValueError(f"{where}: {name} has shape {tuple(got.shape)}, expected {tuple(target_tensor.shape)}")
        target_tensor.copy_(got)
    return head.eval()
