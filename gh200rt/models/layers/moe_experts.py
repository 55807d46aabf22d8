"""Top-k routing and the grouped expert computation of an MoE layer, in plain torch.

This is the reference a fused MoE kernel must reproduce (DESIGN.md, "Mixture of experts"): the step's
``T x k`` (token, choice) pairs are sorted by expert id, so each expert's tokens form one contiguous run;
each expert that has tokens runs its MLP once over its run (one GEMM per projection); the outputs are
scaled by their routing weights and summed per token.

Experts on the host's cores (the ``cpu`` tier, weights/expert_cpu.py): ``ExpertRun`` hands the ``ExpertAccess`` the
rows of the experts it computes on the host before the device computes its own, so the two overlap (the layer's shared
expert too), and writes the host's outputs into the same buffer before the weighted sum: a token's contributions are
added in the same order wherever each was computed.

What is bit-stable: a token's output depends on its own row only through the experts' GEMMs. Its k
contributions are added in ascending expert id, each starting from the first (as transformers' loop over
experts with ``index_add_`` does), so neither the order of tokens in the batch nor which other tokens share
an expert changes the order of the additions: permuting a batch permutes its outputs bit for bit. What is
not: a GEMM library may pick a different kernel for a different number of rows (a one-row run takes a
matrix-vector path), so the same token in a run of 1 and of 5 rows may differ in the last bit, exactly as
a dense linear may for a different batch size.
"""
from __future__ import annotations

from collections.abc import Callable

import torch


class ExpertAccess:
    """What ``grouped_experts`` calls around the experts a step routes to: ``begin(active)`` with the ids of the
    experts that have tokens, in the order they run (ascending), then ``before(e)`` / ``after(e)`` around each.
    The weight store's streamed experts are copied into staging slots here (weights/expert_staging.py)."""

    def begin(self, active: list[int]) -> None:
        pass

    def before(self, expert: int) -> None:
        pass

    def after(self, expert: int) -> None:
        pass

    def stages_experts(self) -> bool:
        """Whether some expert is placed only once the step's routing is known on the host: copied in (streamed)
        or computed by the host's cores (cpu). The fused kernels, which never read the routing back, cannot serve
        such a layer."""
        return False

    def host_experts(self, counts: list[int]) -> list[int]:
        """The experts this step computes on the host's cores (``counts[e]``: the step's pairs routed to e), in
        ascending id; the others run on the device."""
        return []

    def start_host(self, rows: torch.Tensor, experts: list[int], counts: list[int], block_rows: int | None):
        """Start computing ``experts`` on the host over ``rows`` (their pairs' input rows, expert after expert,
        ``counts[e]`` each); returns a job whose ``result()`` is the outputs in the same order, on ``rows``' device."""
        raise NotImplementedError


NO_EXPERT_ACCESS = ExpertAccess()


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int64 [T, k]) from router ``logits`` [T, E]: softmax in float32 over
    all experts, the k largest, renormalised to sum to 1 when ``renormalize`` (which equals Mixtral's softmax
    over the top-k logits). Ties between equal probabilities go to the lower expert id (``torch.topk``)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


# Elements per sigmoid call of ``row_stable_sigmoid``: under torch's parallel grain (32768), so one thread computes it
SIGMOID_CALL_ELEMENTS = 16384


def row_stable_sigmoid(logits: torch.Tensor) -> torch.Tensor:
    """``sigmoid(logits [T, E])`` with every element's bits independent of T. torch's CPU kernel computes the body of
    a tensor in vectors and its tail element by element, whose ``exp`` rounds differently: the same logit would get
    other bits in a step of other size, and a prompt position other routing weights however its prompt was split
    (engine/invariance.py). Rows padded to a multiple of 64 columns, in calls of whole rows under the parallel grain,
    send every element through the vector path."""
    tokens, experts = logits.shape
    if logits.device.type != "cpu" or tokens == 0:
        return logits.sigmoid()
    width = -(-experts // 64) * 64
    padded = logits.new_zeros(tokens, width)
    padded[:, :experts] = logits
    rows = max(1, SIGMOID_CALL_ELEMENTS // width)
    return torch.cat([block.sigmoid() for block in padded.split(rows)])[:, :experts]


def route_grouped(logits: torch.Tensor, correction_bias: torch.Tensor, top_k: int, n_group: int, topk_group: int,
                  renormalize: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's routing (transformers' ``DeepseekV3TopkRouter``, op for op): sigmoid scores in float32
    (``row_stable_sigmoid``); the choice reads them plus ``correction_bias`` [E], within the ``topk_group`` best of
    ``n_group`` groups (a group scores the sum of its two best); the weights are the chosen experts' own scores, renormalised to sum to 1 when
    ``renormalize``, times ``scaling``."""
    scores = row_stable_sigmoid(logits.float())
    choice = scores + correction_bias
    tokens, experts = choice.shape
    group_scores = choice.view(tokens, n_group, experts // n_group).topk(2, dim=-1)[0].sum(dim=-1)
    groups = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, groups, 1)
    keep = group_mask.unsqueeze(-1).expand(tokens, n_group, experts // n_group).reshape(tokens, experts)
    ids = torch.topk(choice.masked_fill(~keep.bool(), float("-inf")), k=top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


def route_group_limited(logits: torch.Tensor, top_k: int, n_group: int, topk_group: int,
                        renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's ``group_limited_greedy`` routing: softmax scores in float32, the top k among the experts of the
    ``topk_group`` groups (of ``n_group``) whose best expert scores highest; renormalised when ``renormalize``."""
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    tokens, experts = scores.shape
    group_scores = scores.view(tokens, n_group, experts // n_group).max(dim=-1).values
    groups = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, groups, 1)
    keep = group_mask.unsqueeze(-1).expand(tokens, n_group, experts // n_group).reshape(tokens, experts)
    weights, ids = torch.topk(scores.masked_fill(~keep.bool(), 0.0), k=top_k, dim=-1, sorted=False)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def group_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """``order`` (int64 [T*k]): the flat (token, choice) pairs sorted by expert id, stably (token order within
    an expert's run); ``counts[e]``: the length of expert e's run."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return order, counts


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int,
                    expert: Callable[[int, torch.Tensor], torch.Tensor], scale_fp32: bool = False,
                    access: ExpertAccess = NO_EXPERT_ACCESS, block_rows: int | None = None) -> torch.Tensor:
    """``sum_j weights[t, j] * expert(ids[t, j], x[t])`` for every token t of ``x`` [T, H].

    ``expert(e, rows)`` runs expert e's MLP over ``rows`` [n, H]; it is called once per expert that has tokens and
    runs on the device, in expert id order, between ``access.before(e)`` and ``access.after(e)``; the experts the
    access computes on the host run there meanwhile. ``scale_fp32``: multiply in float32, then round to ``x``'s dtype
    (Mixtral); else round the weights to ``x``'s dtype first (Qwen-MoE)."""
    run = ExpertRun(x, ids, num_experts, access, block_rows)
    run.compute(expert)
    return run.finish(weights, scale_fp32)


class ExpertRun:
    """One step of ``grouped_experts`` in its phases, so a layer can compute more beside the host's experts:
    ``ExpertRun(...)`` groups the pairs by expert and starts the host's experts, ``compute(expert)`` runs the
    device's, ``finish(weights, scale_fp32)`` waits for the host's and returns the weighted sum."""

    def __init__(self, x: torch.Tensor, ids: torch.Tensor, num_experts: int, access: ExpertAccess = NO_EXPERT_ACCESS,
                 block_rows: int | None = None):
        self.x, self.ids, self.access = x, ids, access
        tokens, self.k = ids.shape
        self.order, self.counts = group_by_expert(ids, num_experts)
        self.starts = [0] * num_experts
        start = 0
        for e, n in enumerate(self.counts):
            self.starts[e], start = start, start + n
        self.out = x.new_empty(tokens * self.k, x.shape[-1])
        self.host = access.host_experts(self.counts)
        self.host_pairs = None
        self.job = None
        if self.host:
            self.host_pairs = torch.cat([self._pairs(e) for e in self.host])
            self.job = access.start_host(x[self.host_pairs // self.k], self.host, self.counts, block_rows)

    def _pairs(self, e: int) -> torch.Tensor:
        return self.order[self.starts[e]:self.starts[e] + self.counts[e]]

    def compute(self, expert: Callable[[int, torch.Tensor], torch.Tensor]) -> None:
        on_host = set(self.host)
        active = [e for e, n in enumerate(self.counts) if n and e not in on_host]
        self.access.begin(active)
        for e in active:
            pairs = self._pairs(e)
            self.access.before(e)
            self.out[pairs] = expert(e, self.x[pairs // self.k])
            self.access.after(e)

    def finish(self, weights: torch.Tensor, scale_fp32: bool) -> torch.Tensor:
        if self.job is not None:
            self.out[self.host_pairs] = self.job.result()
        out = self.out.view(self.ids.shape[0], self.k, -1)
        if scale_fp32:
            scaled = (out.float() * weights.unsqueeze(-1)).to(self.x.dtype)
        else:
            scaled = out * weights.to(self.x.dtype).unsqueeze(-1)
        return sum_in_expert_order(scaled, self.ids)


def sum_in_expert_order(scaled: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``scaled`` [T, k, H] summed over k, each token's contributions added in ascending expert id (what
    transformers' per-expert ``index_add_`` does), the first as the start: the fused kernels end with it too."""
    k = ids.shape[1]
    slot = torch.argsort(ids, dim=1, stable=True)
    scaled = torch.gather(scaled, 1, slot.unsqueeze(-1).expand_as(scaled))
    total = scaled[:, 0]
    for j in range(1, k):
        total = total + scaled[:, j]
    return total.contiguous()
