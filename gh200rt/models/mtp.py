"""The multi-token-prediction layer DeepSeek-V3 (and GLM-4.5) checkpoints ship after their decoder layers, as
``model.layers.<num_hidden_layers>.*``: one more decoder layer of the model's own kind (latent attention, an MoE
block) that predicts the token after next.

At position p it takes the target's final hidden state h_p (after the model's norm) and the embedding of the token
at p + 1 (zero at position 0, as the layer was trained), normalises each (``hnorm``, ``enorm``), projects the two
side by side back to the model's width (``eh_proj``) and runs its decoder layer; ``shared_head`` (a norm and an LM
head of its own) gives the logits of the token at p + 2. Its output before ``shared_head.norm`` is what a further
draft step reads in place of the target's hidden state (``speculative/hidden_drafter.py``). It has its own copies of
the embeddings and LM head, as the checkpoints store them.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata, dense_weight
from gh200rt.models.layers.linear import RefLinear
from gh200rt.models.layers.rmsnorm import RMSNorm
from gh200rt.models.layers.rotary import RotaryEmbedding
from gh200rt.models.llama import DecoderLayer, layer_destinations, layer_fused_names


class MultiTokenPredictor(nn.Module):
    """``arch``: the target's; the layer is built as decoder layer ``arch.num_layers`` (sparse where the model's rule
    makes that index sparse, as V3's is). ``self.arch`` describes the one layer's KV cache."""

    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device):
        super().__init__()
        h = arch.hidden_size
        self.target_arch = arch
        self.arch = dataclasses.replace(arch, num_layers=1, num_nextn_predict_layers=0, mlp_only_layers=())
        self.prefix = f"model.layers.{arch.num_layers}."
        self.capture_layers = (arch.num_layers,)       # the target's final norm output
        self.embed_tokens = nn.Parameter(torch.empty(arch.vocab_size, h, dtype=dtype, device=device),
                                         requires_grad=False)
        self.enorm = RMSNorm(h, arch.rms_norm_eps, dtype, device)
        self.hnorm = RMSNorm(h, arch.rms_norm_eps, dtype, device)
        self.eh_proj = RefLinear(2 * h, h, False, dtype, device)
        self.layer = DecoderLayer(arch, dtype, device, arch.num_layers)
        self.shared_head_norm = RMSNorm(h, arch.rms_norm_eps, dtype, device)
        self.shared_head = RefLinear(h, arch.vocab_size, False, dtype, device)
        self.rotary = RotaryEmbedding(arch.rope_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling,
                                      device)

    def combine(self, captured: torch.Tensor) -> torch.Tensor:
        return captured

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
                meta: AttentionMetadata, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(normed, carried)``: ``shared_head.norm`` of the layer's output (for ``compute_logits``) and the output
        itself, which the next draft step reads as its ``hidden``."""
        embeds = F.embedding(input_ids, self.embed_tokens).masked_fill((positions == 0)[:, None], 0.0)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        cos, sin = self.rotary.tables(positions, x.dtype)
        out = self.layer(x, cos, sin, meta, kv_cache)
        return self.shared_head_norm(out), out

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self.shared_head(normed).float()

    # ---- weights (the loader's model contract, for this layer's names only) ----------------------------------------
    def weight_destinations(self) -> dict[str, torch.Tensor]:
        p = self.prefix
        dest = {p + "embed_tokens.weight": self.embed_tokens.data, p + "enorm.weight": self.enorm.weight.data,
                p + "hnorm.weight": self.hnorm.weight.data,
                p + "eh_proj.weight": dense_weight(self.eh_proj.weight_ref, p + "eh_proj"),
                p + "shared_head.norm.weight": self.shared_head_norm.weight.data,
                p + "shared_head.head.weight": dense_weight(self.shared_head.weight_ref, p + "shared_head.head")}
        dest.update(layer_destinations(self.layer, self.target_arch, p))
        return dest

    def fused_names(self) -> dict[str, str]:
        return layer_fused_names(self.layer, self.prefix)
