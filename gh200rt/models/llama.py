"""Decoder-only transformer of the Llama family (Llama 2/3, Mistral; Qwen2/3 and the MoE families reuse it
via ArchConfig: a layer's MLP is a ``GatedMLP`` or, where ``arch.is_moe_layer``, a ``SparseMoeBlock``).

Checkpoint names follow transformers (``model.layers.N.self_attn.q_proj.weight``...). The model
fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``; ``FUSED_SHARDS`` declares which
checkpoint tensor fills which rows, and ``weight_destinations()`` hands the loader a view for each
checkpoint name so every tensor is written exactly once into wherever its WeightRef points now.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata, WeightRef, dense_weight
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.models.layers.linear import RefLinear
from gh200rt.models.layers.mla import LatentAttention
from gh200rt.models.layers.mlp import GatedMLP
from gh200rt.models.layers.rmsnorm import RMSNorm
from gh200rt.models.layers.rotary import RotaryEmbedding
from gh200rt.models.moe import SparseMoeBlock

# fused module -> the checkpoint modules whose rows it stacks, in order
FUSED_SHARDS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


class DecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device, index: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.latent = arch.is_mla
        self.partial_rotary = arch.rope_dim < arch.head_dim
        self.self_attn = LatentAttention(arch, dtype, device) if self.latent else SelfAttention(arch, dtype, device)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.sparse = arch.is_moe_layer(index)
        self.mlp = SparseMoeBlock(arch, dtype, device) if self.sparse else \
            GatedMLP(arch.hidden_size, arch.intermediate_size, dtype, device)
        # the checkpoint's name for the MLP block (weights named model.layers.N.<this>.*)
        self.mlp_checkpoint_name = "block_sparse_moe" if self.sparse and arch.architecture == "mixtral" else "mlp"
        # the whole layer in one call for a decode step (native CPU ops, backends/cpu/decode_layer.py; one-row steps on
        # CUDA, backends/cuda/decode_layer.py): (layer, hidden, residual, cos, sin, meta, kv_cache) with the layer's
        # input hidden + residual (residual None: hidden) -> the layer's whole output, or None where it does not apply (the layer then runs op by op: always for an MoE layer,
        # and for a step whose linears run in fixed row blocks, as the native linears take the rows as they come)
        self.decode_layer_fn = None

    def forward(self, hidden, cos, sin, meta, kv_cache):
        """The layer's output."""
        out, residual = self.forward_deferred(hidden, None, cos, sin, meta, kv_cache)
        return out if residual is None else out + residual

    def forward_deferred(self, hidden, residual, cos, sin, meta, kv_cache):
        """``(out, residual)`` with the layer's output ``out + residual`` (``residual`` None: ``out``), and its input
        given the same way: the residual add at a layer boundary is left to the next layer's input norm (or the
        model's final norm), which fuses it into the norm's launch where the Triton kernels run (the same value either
        way: the fused kernel rounds the sum before it normalises, as the separate add stores it)."""
        if self.decode_layer_fn is not None and not (self.sparse or self.latent or self.partial_rotary) \
                and meta.linear_rows is None:
            out = self.decode_layer_fn(self, hidden, residual, cos, sin, meta, kv_cache)
            if out is not None:
                return out, None
        if residual is None:
            normed, residual = self.input_layernorm(hidden), hidden
        else:
            normed, residual = self.input_layernorm.add_and_norm(hidden, residual)
        attended = self.self_attn(normed, cos, sin, meta, kv_cache)
        normed, residual = self.post_attention_layernorm.add_and_norm(attended, residual)
        return self.mlp(normed, meta.linear_rows), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, arch: ArchConfig, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        super().__init__()
        self.arch = arch
        self.dtype = dtype
        self.embed_tokens = nn.Parameter(torch.empty(arch.vocab_size, arch.hidden_size, dtype=dtype, device=device),
                                         requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(arch, dtype, device, i) for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.lm_head = RefLinear(arch.hidden_size, arch.vocab_size, False, dtype, device)
        if arch.tie_word_embeddings:
            self.lm_head.weight_ref.current = self.embed_tokens
        self.rotary = RotaryEmbedding(arch.rope_dim, arch.max_position_embeddings,
                                      arch.rope_theta, arch.rope_scaling, device)
        # every decoder layer of a decode step in one call (native CPU ops, backends/cpu/decode_stack.py):
        # (model, hidden, cos, sin, meta, kv_caches) -> the last layer's output, or None (the layers run one by one)
        self.decode_stack_fn = None

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """The hidden states entering layer 0, and what every layer takes besides them (cos, sin)."""
        hidden = F.embedding(input_ids, self.embed_tokens)
        return hidden, self.rotary.tables(positions, hidden.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        hidden, context = self.embed(input_ids, positions)
        if self.decode_stack_fn is not None:
            stacked = self.decode_stack_fn(self, hidden, *context, meta, kv_caches)
            if stacked is not None:
                return self.final_norm(stacked, None)
        residual = None
        for i, layer in enumerate(self.layers):
            hidden, residual = layer.forward_deferred(hidden, residual, *context, meta, kv_caches[i])
        return self.final_norm(hidden, residual)

    def final_norm(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """``norm(hidden + residual)`` after the last layer (``residual`` None: ``norm(hidden)``)."""
        return self.norm(hidden) if residual is None else self.norm.add_and_norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    # ---- weights -------------------------------------------------------------------------------
    def layer_weight_refs(self, index: int) -> dict[str, WeightRef]:
        """Every linear weight of decoder layer ``index`` (an MoE layer's router, experts and shared expert too)."""
        layer = self.layers[index]
        if layer.latent:
            refs = {f"self_attn.{name}": ref for name, ref in layer.self_attn.weight_refs().items()}
        else:
            refs = {"self_attn.qkv_proj": layer.self_attn.qkv_proj.weight_ref,
                    "self_attn.o_proj": layer.self_attn.o_proj.weight_ref}
        refs.update({f"mlp.{name}": ref for name, ref in layer.mlp.weight_refs().items()})
        return refs

    def expert_weight_refs(self, index: int) -> list[dict[str, WeightRef]]:
        """Routed expert e's linear weights of decoder layer ``index`` (``[]`` for a dense layer), keyed as in
        ``layer_weight_refs``: the units the weight store places one by one."""
        mlp = self.layers[index].mlp
        if not hasattr(mlp, "expert_refs"):
            return []
        return [{f"mlp.experts.{e}.{name}": ref for name, ref in refs.items()}
                for e, refs in enumerate(mlp.expert_refs())]

    def routing_counts(self) -> dict[int, torch.Tensor]:
        """MoE layer -> (token, choice) pairs routed to each of its experts since start (host int64 [E])."""
        return {i: layer.mlp.routing_counts() for i, layer in enumerate(self.layers)
                if hasattr(layer.mlp, "routing_counts")}

    def set_expert_access(self, index: int, access) -> None:
        """What decoder layer ``index``'s MoE block calls around the experts a step routes to (``ExpertAccess``)."""
        self.layers[index].mlp.expert_access = access

    def fused_names(self) -> dict[str, str]:
        """Checkpoint weight name -> the fused weight it is a row block of (for error messages)."""
        out = {}
        for i, layer in enumerate(self.layers):
            out.update(layer_fused_names(layer, f"model.layers.{i}."))
        return out

    def weight_destinations(self) -> dict[str, torch.Tensor]:
        """Every checkpoint tensor name -> the tensor (or row view of a fused tensor) it must be copied into."""
        dest = {"model.embed_tokens.weight": self.embed_tokens.data, "model.norm.weight": self.norm.weight.data}
        if not self.arch.tie_word_embeddings:
            dest["lm_head.weight"] = dense_weight(self.lm_head.weight_ref, "lm_head.weight")
        for i, layer in enumerate(self.layers):
            dest.update(layer_destinations(layer, self.arch, f"model.layers.{i}."))
        return dest


def layer_fused_names(layer: DecoderLayer, prefix: str) -> dict[str, str]:
    """A decoder layer's checkpoint names (under ``prefix``) -> the fused weight each is a row block of."""
    out = {}
    for part in () if layer.latent else FUSED_SHARDS["self_attn.qkv_proj"]:
        for kind in ("weight", "bias"):
            out[f"{prefix}{part}.{kind}"] = f"{prefix}self_attn.qkv_proj.{kind}"
    out.update(layer.mlp.fused_names(f"{prefix}{layer.mlp_checkpoint_name}."))
    return out


def layer_destinations(layer: DecoderLayer, arch: ArchConfig, prefix: str) -> dict[str, torch.Tensor]:
    """A decoder layer's checkpoint names (under ``prefix``) -> the tensor or row view each is copied into."""
    attn = layer.self_attn
    dest = {prefix + "input_layernorm.weight": layer.input_layernorm.weight.data,
            prefix + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight.data}
    dest.update(layer.mlp.checkpoint_destinations(f"{prefix}{layer.mlp_checkpoint_name}."))
    if layer.latent:
        dest.update(attn.checkpoint_destinations(prefix + "self_attn."))
        return dest
    dest[prefix + "self_attn.o_proj.weight"] = dense_weight(attn.o_proj.weight_ref, prefix + "o_proj")
    qkv = dense_weight(attn.qkv_proj.weight_ref, prefix + "self_attn.qkv_proj")
    start = 0
    for part, size in zip(FUSED_SHARDS["self_attn.qkv_proj"], (arch.q_size, arch.kv_size, arch.kv_size)):
        dest[f"{prefix}{part}.weight"] = qkv[start:start + size]
        if attn.qkv_proj.bias is not None:
            dest[f"{prefix}{part}.bias"] = attn.qkv_proj.bias.data[start:start + size]
        start += size
    if attn.q_norm is not None:
        dest[prefix + "self_attn.q_norm.weight"] = attn.q_norm.weight.data
        dest[prefix + "self_attn.k_norm.weight"] = attn.k_norm.weight.data
    return dest
