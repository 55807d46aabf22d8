"""Multi-head latent attention (DeepSeek-V2/V3): the paged pool holds one latent row per token, and every query
head attends to it in the weight-absorbed form.

A token's KV is ``c = kv_a_layernorm(kv_a_proj(x)[:r])`` (``r = kv_lora_rank``, 512 for V3) and its rotated key
``k_pe`` (``qk_rope_head_dim``, 64): ``[c | k_pe]``, 576 values, one plane of the pool (``ArchConfig.kv_planes``).
Head h's key over it is ``[W_UK[h] c | k_pe]`` and its value ``W_UV[h] c``, where ``kv_b_proj`` stacks ``W_UK`` and
``W_UV`` per head. Absorbed, ``q_nope . W_UK c = (W_UK^T q_nope) . c``: each head's query becomes
``[W_UK[h]^T q_nope | q_pe]`` in latent space, all heads attend to the one latent "KV head" (multi-query
attention), and the weighted sum of latents goes through ``W_UV[h]`` after. The values are the first ``r``
columns of the very rows that are the keys, so the attention op reads one plane as both (an expanded view of
stride 0): the paged kernels of every backend compute it unchanged, and the last ``qk_rope_head_dim`` columns of
their output are dropped.

The same form serves decodes and prompts, so a prompt position's bits do not depend on how its prompt was split
(the prefix-cache invariance, engine/invariance.py): the two absorption products run in the step's row blocks
like any linear. ``expanded_attention`` is the textbook form (per-head K and V materialised), the reference the
absorbed one is checked against; a GPU computes long prompt chunks in it (``mla_prefill.py``, ``prefill_fn``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gh200rt.kv import fp8
from gh200rt.kv.attention import paged_attention, write_kv
from gh200rt.lora.absorbed import add_query_deltas, add_value_deltas
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata, WeightRef
from gh200rt.models.layers.linear import ROW_BLOCK_SIZES, RefLinear
from gh200rt.models.layers.rmsnorm import RMSNorm
from gh200rt.models.layers.rotary import apply_rotary, deinterleave, yarn_mscale
from gh200rt.models.layers.row_blocks import in_row_blocks

# linears the model reads as dense tensors rather than multiplying by (``absorbed_weights``): a placement keeps
# them in a dense or packed form with ``dequantize``, never a route's multiply-only form
ABSORBED_WEIGHTS = ("self_attn.kv_b_proj",)


def softmax_scale(arch: ArchConfig) -> float:
    """``qk_head_dim^-0.5``, times YaRN's ``mscale(factor, mscale_all_dim)^2`` (what DeepSeek's attention applies)."""
    scale = (arch.qk_nope_head_dim + arch.head_dim) ** -0.5
    scaling = arch.rope_scaling
    if scaling and scaling.get("rope_type") == "yarn" and scaling.get("mscale_all_dim"):
        scale *= yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
    return scale


class LatentAttention(nn.Module):
    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device: torch.device | str = "cpu"):
        super().__init__()
        heads, hidden = arch.num_heads, arch.hidden_size
        self.num_heads, self.rank, self.rope_dim = heads, arch.kv_lora_rank, arch.head_dim
        self.nope_dim, self.v_dim = arch.qk_nope_head_dim, arch.v_head_dim
        self.interleaved = arch.rope_interleave
        self.scale = softmax_scale(arch)
        q_width = heads * (self.nope_dim + self.rope_dim)
        if arch.q_lora_rank:
            self.q_a_proj = RefLinear(hidden, arch.q_lora_rank, arch.attention_bias, dtype, device)
            self.q_a_layernorm = RMSNorm(arch.q_lora_rank, arch.rms_norm_eps, dtype, device)
            self.q_b_proj = RefLinear(arch.q_lora_rank, q_width, False, dtype, device)
        else:
            self.q_a_proj = self.q_a_layernorm = None
            self.q_b_proj = RefLinear(hidden, q_width, False, dtype, device)   # the checkpoint's q_proj
        self.kv_a_proj_with_mqa = RefLinear(hidden, self.rank + self.rope_dim, arch.attention_bias, dtype, device)
        self.kv_a_layernorm = RMSNorm(self.rank, arch.rms_norm_eps, dtype, device)
        self.kv_b_proj = RefLinear(self.rank, heads * (self.nope_dim + self.v_dim), False, dtype, device)
        self.o_proj = RefLinear(heads * self.v_dim, hidden, arch.attention_bias, dtype, device)
        # an fp8 pool's scale: the one plane is read as K and as V, so both entries are always equal
        self.register_buffer("kv_scale", torch.ones(2, dtype=torch.float32, device=device), persistent=False)
        self.calculate_kv_scales = False
        # the backend's ops (backends/interface.py): the same hooks as SelfAttention's, without the fused decode block
        self.rotary_fn = apply_rotary
        self.write_kv_fn = write_kv
        self.attention_fn = paged_attention
        # a backend's form for prompt chunks (mla_prefill.expanded_prefill on a GPU): the step's values, or None
        self.prefill_fn = None
        # kv_b_proj's LoRA slots (a ``LoraLinear``, set by ``install_lora``): added through the absorption products
        self.kv_b_lora = None
        self._absorbed: tuple[int, torch.Tensor, torch.Tensor] | None = None

    # ---- the forward pass --------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata,
                kv_cache: torch.Tensor) -> torch.Tensor:
        tokens, rows = hidden.shape[0], meta.linear_rows
        q_nope, q_pe, latent = self.project(hidden, cos, sin, rows)
        if self.calculate_kv_scales and fp8.is_fp8(kv_cache.dtype):
            self.kv_scale.copy_(fp8.calculated_scales(latent, latent, kv_cache.dtype))
            self.calculate_kv_scales = False
        self.write_kv_fn(_planes(kv_cache), latent, latent, meta.slot_mapping, self.kv_scale)
        values = self.attend(q_nope, q_pe, kv_cache, meta)
        return self.o_proj(values.reshape(tokens, self.num_heads * self.v_dim), rows)

    def attend(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
               ) -> torch.Tensor:
        """The step's values ``[T, H, v_head_dim]`` from its queries, the latent rows already in the pool: the
        queries absorbed into latent space, one multi-query attention over the pool, the result through ``W_UV``."""
        lora = self.kv_b_lora
        if self.prefill_fn is not None and lora is None:    # the expanded form reads kv_b_proj's rows unadapted
            values = self.prefill_fn(self, q_nope, q_pe, kv_cache, meta)
            if values is not None:
                return values
        rows = meta.linear_rows
        w_uk, w_uv_t = self.absorbed_weights()
        q_latent = self._per_head(q_nope, w_uk, rows)
        if lora is not None:
            add_query_deltas(lora, q_latent, q_nope, self.nope_dim, rows)
        query = torch.cat((q_latent, q_pe), dim=-1)
        out = self.attention_fn(query, _planes(kv_cache), meta, self.scale, 1, self.kv_scale)[..., :self.rank]
        values = self._per_head(out, w_uv_t, rows)
        return values if lora is None else add_value_deltas(lora, values, out, self.nope_dim, rows)

    def project(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: int | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q_nope [T, H, nope], q_pe [T, H, rope], latent [T, 1, r + rope])``, rotary applied."""
        tokens = hidden.shape[0]
        q_in = hidden if self.q_a_proj is None else self.q_a_layernorm(self.q_a_proj(hidden, rows))
        q = self.q_b_proj(q_in, rows).view(tokens, self.num_heads, self.nope_dim + self.rope_dim)
        q_nope, q_pe = q[..., :self.nope_dim], q[..., self.nope_dim:]
        kv = self.kv_a_proj_with_mqa(hidden, rows)
        c, k_pe = self.kv_a_layernorm(kv[:, :self.rank]), kv[:, None, self.rank:]
        if self.interleaved:
            q_pe, k_pe = deinterleave(q_pe), deinterleave(k_pe)
        q_pe, k_pe = self.rotary_fn(q_pe, cos, sin), self.rotary_fn(k_pe, cos, sin)
        return q_nope, q_pe, torch.cat((c[:, None, :], k_pe), dim=-1)

    def _per_head(self, x: torch.Tensor, weight: torch.Tensor, rows: int | None) -> torch.Tensor:
        """One absorption product, ``x [T, H, a]`` times head h's ``weight[h]`` ``[a, b]`` -> ``[T, H, b]`` (one batched
        matmul over the heads), in the step's row blocks where it has them, so a row's bits do not depend on the rows
        beside it."""
        heads, width = x.shape[1], x.shape[2]

        def product(flat: torch.Tensor) -> torch.Tensor:
            batched = flat.view(-1, heads, width).transpose(0, 1)
            return torch.bmm(batched, weight).transpose(0, 1).reshape(flat.shape[0], -1)
        if rows is None or x.shape[0] == 0:
            return torch.bmm(x.transpose(0, 1), weight).transpose(0, 1)
        flat = x.reshape(x.shape[0], heads * width)
        route = ("mla", tuple(weight.shape), weight.dtype, x.device.type)
        cuts = ROW_BLOCK_SIZES.cuts(route, product, flat.shape[1], flat.dtype, rows, flat.shape[0])
        return in_row_blocks(product, flat, rows, cuts).view(x.shape[0], heads, -1)

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK [H, nope, r]`` and ``W_UV^T [H, r, v]``, contiguous, from ``kv_b_proj``'s weight as it is now (a
        quantized or packed one dequantized), made once per placement of it (keyed on its ref's version). Per-head
        products over strided slices of the weight would copy them at every call (10x slower at V3's shape); the
        copies take as much memory as ``kv_b_proj`` itself."""
        ref = self.kv_b_proj.weight_ref
        cached = self._absorbed
        if cached is None or cached[0] != ref.version:
            weight = ref.current if isinstance(ref.current, torch.Tensor) else ref.current.dequantize()
            stacked = weight.view(self.num_heads, self.nope_dim + self.v_dim, self.rank).to(self.kv_scale.device)
            w_uk = stacked[:, :self.nope_dim].to(self.o_proj.weight_ref.dtype).contiguous()
            w_uv_t = stacked[:, self.nope_dim:].transpose(1, 2).to(w_uk.dtype).contiguous()
            cached = self._absorbed = (ref.version, w_uk, w_uv_t)
        return cached[1], cached[2]

    # ---- weights ---------------------------------------------------------------------------------
    def weight_refs(self) -> dict[str, WeightRef]:
        refs = {} if self.q_a_proj is None else {"q_a_proj": self.q_a_proj.weight_ref}
        refs.update(q_b_proj=self.q_b_proj.weight_ref, kv_a_proj_with_mqa=self.kv_a_proj_with_mqa.weight_ref,
                    kv_b_proj=self.kv_b_proj.weight_ref, o_proj=self.o_proj.weight_ref)
        return refs

    def checkpoint_destinations(self, prefix: str) -> dict[str, torch.Tensor]:
        """``prefix``: ``model.layers.N.self_attn.``."""
        linears = {("q_proj" if self.q_a_proj is None else "q_b_proj"): self.q_b_proj,
                   "kv_a_proj_with_mqa": self.kv_a_proj_with_mqa, "kv_b_proj": self.kv_b_proj, "o_proj": self.o_proj}
        if self.q_a_proj is not None:
            linears["q_a_proj"] = self.q_a_proj
        dest = {}
        for name, linear in linears.items():
            dest[f"{prefix}{name}.weight"] = _dense(linear.weight_ref, prefix + name)
            if linear.bias is not None:
                dest[f"{prefix}{name}.bias"] = linear.bias.data
        dest[f"{prefix}kv_a_layernorm.weight"] = self.kv_a_layernorm.weight.data
        if self.q_a_layernorm is not None:
            dest[f"{prefix}q_a_layernorm.weight"] = self.q_a_layernorm.weight.data
        return dest


def _planes(kv_cache: torch.Tensor) -> torch.Tensor:
    """The one-plane latent pool as the ``[2, ...]`` pool attention ops read: K and V, the same rows (stride 0)."""
    return kv_cache.expand(2, *kv_cache.shape[1:])


def _dense(ref: WeightRef, name: str) -> torch.Tensor:
    assert isinstance(ref.current, torch.Tensor), f"{name}: the loader writes dense weights only"
    return ref.current


def expanded_attention(attn: LatentAttention, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       past_latent: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's attention in the expanded form, with no paged pool: ``hidden [T, hidden]`` are its newest
    tokens, ``past_latent [S, 1, r + rope]`` the latent rows before them. Returns ``(output [T, hidden], every
    latent row [S + T, 1, r + rope])``. Per-head keys ``[W_UK c | k_pe]`` and values ``W_UV c`` are materialised
    for every position (what the absorbed form avoids)."""
    q_nope, q_pe, latent = attn.project(hidden, cos, sin, None)
    rows = latent if past_latent is None else torch.cat((past_latent, latent))
    kv = attn.kv_b_proj(rows[:, 0, :attn.rank]).view(rows.shape[0], attn.num_heads, -1)
    k_nope, v = kv[..., :attn.nope_dim], kv[..., attn.nope_dim:]
    k = torch.cat((k_nope, rows[:, :, attn.rank:].expand(-1, attn.num_heads, -1)), dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1)
    total, new = rows.shape[0], hidden.shape[0]
    allowed = torch.arange(total)[None, :] <= torch.arange(total - new, total)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=allowed.to(q.device), scale=attn.scale)
    return attn.o_proj(out.transpose(0, 1).reshape(new, -1)), rows
