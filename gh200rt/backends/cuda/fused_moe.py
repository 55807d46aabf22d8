"""A SparseMoeBlock's routed experts through the fused Triton kernels (kernels/triton/fused_moe.py).

``FusedExperts`` is one block's ``fused_experts_fn`` (installed with the other Triton kernels by
backends/cuda/ops.py, so only on a GPU or under the interpreter): ``(block, x, weights, ids, block_rows)`` ->
the experts' summed output ``[T, H]``, or None when the kernels cannot serve the layer now and the block runs
``grouped_experts`` instead:

- a layer with streamed experts: their staging copies are issued per routed expert, which needs the router's
  choices on the host (ExpertStaging); the fused path never reads them back, which is what lets a CUDA graph
  capture it;
- weights the kernels cannot read (``expert_stack`` says why, logged once per reason): experts of one layer
  in different formats, int4 groups that do not tile the K loop.

Each projection's address table is built from the experts' WeightRefs and kept until one of them is
repointed (``WeightRef.version``): an expert moved between tiers, or a staging slot bound. With
``block_rows`` (batch-invariant steps) the tile height is fixed, so a row's bits do not depend on the batch.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class FusedExperts:
    def __init__(self):
        self._key: tuple | None = None   # (device, every expert ref's version) the tables were built for
        self._stacks = None        # (gate_up, down) ExpertStacks, or the reason they cannot be built
        self._logged: set[str] = set()

    def why_not(self, block, device: torch.device) -> str | None:
        """Why this block's experts cannot run in the fused kernels now (None: they can)."""
        if block.expert_access.stages_experts():
            return "the layer has streamed or cpu-tier experts, placed as the router picks them"
        stacks = self._stacks_for(block, device)
        return stacks if isinstance(stacks, str) else None

    def __call__(self, block, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 block_rows: int | None) -> torch.Tensor | None:
        from gh200rt.kernels.triton.fused_moe import SMALL_BLOCK_M, fused_moe
        why = self.why_not(block, x.device)
        if why is not None:
            if why not in self._logged:
                self._logged.add(why)
                log.info("an MoE layer runs its experts grouped in torch, not in the fused kernels: %s", why)
            return None
        gate_up, down = self._stacks
        return fused_moe(x, weights, ids, gate_up, down, block.scale_fp32,
                         block_m=SMALL_BLOCK_M if block_rows is not None else None)

    def _stacks_for(self, block, device: torch.device):
        from gh200rt.kernels.triton.fused_moe_operands import expert_stack
        refs = block.expert_refs()
        key = (device, *(ref.version for expert in refs for ref in expert.values()))
        if key != self._key:
            stacks = [expert_stack([expert[part].current for expert in refs], device)
                      for part in ("gate_up_proj", "down_proj")]
            reasons = [s for s in stacks if isinstance(s, str)]
            self._stacks = reasons[0] if reasons else tuple(stacks)
            self._key = key
        return self._stacks
