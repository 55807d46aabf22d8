"""The sparse MLP of an MoE decoder layer: router, k of E routed experts, optional shared expert.

Families (``ArchConfig``): Qwen3-MoE (softmax top-k, renormalised when ``norm_topk_prob``), Qwen2-MoE
(the same, plus a shared expert scaled by ``sigmoid(shared_expert_gate(x))``), Mixtral (softmax over the
top-k logits: the renormalised form; routing weights applied in float32), DeepSeek-V3 (sigmoid scores with a
correction bias for the choice, group-limited, weights times ``routed_scaling_factor`` applied in float32, plus
ungated shared experts: ``route_grouped``), DeepSeek-V2 (softmax, greedy or limited to the groups with the best
experts, ``route_group_limited``, times ``routed_scaling_factor``; shared experts as V3).

Weights. Every expert is a ``GatedMLP`` with its own two WeightRefs (``experts.E.gate_up_proj`` ``[2I, H]``,
``experts.E.down_proj`` ``[H, I]``), so the weight store places, streams and converts each one as it does
any 2-D linear, and a later per-expert placement moves one expert by repointing its two refs. At load the
refs are slices of one stacked ``[E, 2I, H]`` and one ``[E, H, I]`` tensor, and ``weight_refs`` lists every
expert's gate_up before every expert's down, so a layer slab, staging slot or arena run holds each stack at
one stride (what a grouped kernel reads).

Checkpoint names: Qwen ``mlp.gate``, ``mlp.experts.E.{gate,up,down}_proj``, ``mlp.shared_expert.*``,
``mlp.shared_expert_gate``; Mixtral ``block_sparse_moe.gate``, ``block_sparse_moe.experts.E.{w1,w3,w2}``;
DeepSeek-V3 ``mlp.gate`` with ``mlp.gate.e_score_correction_bias``, ``mlp.shared_experts.*``.
"""
from __future__ import annotations

import torch
from torch import nn

from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import WeightRef, dense_weight
from gh200rt.models.layers.linear import RefLinear
from gh200rt.models.layers.mlp import HF_NAMES, GatedMLP
from gh200rt.models.layers.moe_experts import (NO_EXPERT_ACCESS, ExpertRun, route, route_group_limited, route_grouped,
                                               row_stable_sigmoid)

MIXTRAL_EXPERT_NAMES = ("w1", "w3", "w2")   # gate, up, down


class SparseMoeBlock(nn.Module):
    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device):
        super().__init__()
        h, i, e = arch.hidden_size, arch.moe_intermediate_size, arch.num_experts
        self.num_experts, self.top_k = e, arch.num_experts_per_tok
        self.renormalize, self.scale_fp32 = arch.norm_topk_prob, arch.routing_weights_fp32
        self.expert_names = MIXTRAL_EXPERT_NAMES if arch.architecture == "mixtral" else HF_NAMES
        self.gate = RefLinear(h, e, False, dtype, device)
        gate_up = torch.empty(e, 2 * i, h, dtype=dtype, device=device)
        down = torch.empty(e, h, i, dtype=dtype, device=device)
        self.experts = nn.ModuleList(GatedMLP(h, i, dtype, device, gate_up[j], down[j]) for j in range(e))
        shared = arch.shared_expert_intermediate_size
        self.shared_expert = GatedMLP(h, shared, dtype, device) if shared else None
        # Qwen2-MoE scales its shared expert by a gate; DeepSeek's shared experts add as they are
        gated = shared and arch.architecture == "qwen2_moe"
        self.shared_expert_gate = RefLinear(h, 1, False, dtype, device) if gated else None
        self.shared_name = "shared_expert" if arch.architecture == "qwen2_moe" else "shared_experts"
        self.grouped = arch.scoring_func == "sigmoid"
        self.group_limited = arch.topk_method == "group_limited_greedy"
        self.n_group, self.topk_group, self.scaling = arch.n_group, arch.topk_group, arch.routed_scaling_factor
        if self.grouped:
            self.register_buffer("correction_bias", torch.zeros(e, dtype=torch.float32, device=device))
        self.expert_access = NO_EXPERT_ACCESS   # the weight store stages streamed experts through it
        self.routed_tokens: torch.Tensor | None = None   # int64 [E]: (token, choice) pairs routed to each expert
        # the fused Triton kernels where installed (backends/cuda/fused_moe.py); None: the grouped torch path
        self.fused_experts_fn = None

    def forward(self, x: torch.Tensor, block_rows: int | None = None) -> torch.Tensor:
        """``block_rows``: every linear, each expert's included, on blocks of exactly that many rows, so a token's
        bits do not depend on which other tokens share the step or an expert (layers/row_blocks.py)."""
        logits = self.gate(x, block_rows)
        if self.grouped:
            weights, ids = route_grouped(logits, self.correction_bias, self.top_k, self.n_group, self.topk_group,
                                         self.renormalize, self.scaling)
        else:
            weights, ids = route_group_limited(logits, self.top_k, self.n_group, self.topk_group, self.renormalize) \
                if self.group_limited else route(logits, self.top_k, self.renormalize)
            if self.scaling != 1.0:     # DeepSeek-V2's routed_scaling_factor
                weights = weights * self.scaling
        self._count(ids)
        out = None
        if self.fused_experts_fn is not None:
            out = self.fused_experts_fn(self, x, weights, ids, block_rows)
        if out is not None:
            return self._add_shared(out, self._shared(x, block_rows))
        experts = self.experts
        run = ExpertRun(x, ids, self.num_experts, self.expert_access, block_rows)   # starts the host's experts
        run.compute(lambda e, rows: experts[e](rows, block_rows))
        shared = self._shared(x, block_rows)        # beside the host's experts, if any
        return self._add_shared(run.finish(weights, self.scale_fp32), shared)

    def _shared(self, x: torch.Tensor, block_rows: int | None) -> torch.Tensor | None:
        """The shared expert's term (Qwen2-MoE's scaled by its gate), None without one."""
        if self.shared_expert_gate is not None:
            gate = row_stable_sigmoid(self.shared_expert_gate(x, block_rows).float()).to(x.dtype)
            return gate * self.shared_expert(x, block_rows)
        if self.shared_expert is not None:
            return self.shared_expert(x, block_rows)
        return None

    @staticmethod
    def _add_shared(routed: torch.Tensor, shared: torch.Tensor | None) -> torch.Tensor:
        return routed if shared is None else routed + shared

    def _count(self, ids: torch.Tensor) -> None:
        """Routing statistics on the device the step runs on (no host sync): what placement learns from."""
        if self.routed_tokens is None or self.routed_tokens.device != ids.device:
            self.routed_tokens = torch.zeros(self.num_experts, dtype=torch.int64, device=ids.device)
        flat = ids.reshape(-1)          # scatter_add_, not bincount: bincount reads its size back on a GPU
        self.routed_tokens.scatter_add_(0, flat, torch.ones_like(flat))

    def routing_counts(self) -> torch.Tensor:
        """(token, choice) pairs routed to each expert since start, on the host."""
        if self.routed_tokens is None:
            return torch.zeros(self.num_experts, dtype=torch.int64)
        return self.routed_tokens.cpu()

    # ---- weights -------------------------------------------------------------------------------
    def weight_refs(self) -> dict[str, WeightRef]:
        refs = {"gate": self.gate.weight_ref}
        for part in ("gate_up_proj", "down_proj"):   # each stack back to back (see the module docstring)
            refs.update({f"experts.{e}.{part}": expert.weight_refs()[part] for e, expert in enumerate(self.experts)})
        if self.shared_expert is not None:
            refs.update({f"shared_expert.{n}": r for n, r in self.shared_expert.weight_refs().items()})
        if self.shared_expert_gate is not None:
            refs["shared_expert_gate"] = self.shared_expert_gate.weight_ref
        return refs

    def expert_refs(self) -> list[dict[str, WeightRef]]:
        """Each routed expert's two WeightRefs (``gate_up_proj``, ``down_proj``)."""
        return [expert.weight_refs() for expert in self.experts]

    def checkpoint_destinations(self, block: str) -> dict[str, torch.Tensor]:
        """``block``: the checkpoint's prefix of this block (``model.layers.N.mlp.``, Mixtral's
        ``model.layers.N.block_sparse_moe.``)."""
        dest = {f"{block}gate.weight": dense_weight(self.gate.weight_ref, block + "gate")}
        for e, expert in enumerate(self.experts):
            dest.update(expert.checkpoint_destinations(f"{block}experts.{e}.", self.expert_names))
        if self.shared_expert is not None:
            dest.update(self.shared_expert.checkpoint_destinations(f"{block}{self.shared_name}."))
        if self.shared_expert_gate is not None:
            dest[f"{block}shared_expert_gate.weight"] = dense_weight(self.shared_expert_gate.weight_ref,
                                                                     block + "shared_expert_gate")
        if self.grouped:
            dest[f"{block}gate.e_score_correction_bias"] = self.correction_bias
        return dest

    def fused_names(self, block: str) -> dict[str, str]:
        out = {}
        for e in range(self.num_experts):
            out.update(GatedMLP.fused_names(f"{block}experts.{e}.", self.expert_names))
        if self.shared_expert is not None:
            out.update(GatedMLP.fused_names(f"{block}{self.shared_name}."))
        return out
