"""Which slice of a model each tensor-parallel rank holds, and which models and sizes can be sharded.

Rank r of N holds query heads ``[r*H/N, (r+1)*H/N)``, MLP columns ``[r*I/N, (r+1)*I/N)`` and vocabulary rows
``[r*P/N, (r+1)*P/N)``, where P is the vocabulary padded up to a multiple of N: the rows at V and beyond hold zeros
(their logits are cut off on rank 0 before sampling). KV heads are split the same way where the model has at least N of them; with fewer, each
KV head is replicated on the N/KV ranks whose query heads use it (rank r holds KV head ``r*KV//N``). Checkpoint
tensors are sliced along their output rows (q/k/v, gate/up, embedding, LM head, q/k/v bias: column-parallel) or
their input columns (o, down: row-parallel, whose partial outputs are all-reduced); norms are replicated.
An MoE layer's routed experts and shared expert are split the same way along their own intermediate dimension
(columns ``[r*I_e/N, (r+1)*I_e/N)`` of each); its router and shared-expert gate are replicated. Latent attention
(DeepSeek-V2 / V3) splits its heads the same way; its latent row is computed whole on every rank.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.layers.mlp import HF_NAMES
from gh200rt.models.moe import MIXTRAL_EXPERT_NAMES

FAMILIES = "Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V2 / V3 and GLM-4.5"

# (dim, start, stop): a checkpoint tensor's slice along dim 0 (rows) or 1 (columns)
Slice = tuple[int, int, int]


def check_shardable(arch: ArchConfig, world_size: int) -> None:
    """Raise ValueError, naming the sizes and the values that work, where ``arch`` cannot be split N ways."""
    flag = f"--tensor-parallel-size {world_size}"
    sizes = {"attention heads": arch.num_heads, "intermediate size": arch.intermediate_size}
    if arch.is_moe:
        sizes["expert intermediate size"] = arch.moe_intermediate_size
        if arch.shared_expert_intermediate_size:
            sizes["shared expert intermediate size"] = arch.shared_expert_intermediate_size
    for what, size in sizes.items():
        if size % world_size:
            raise ValueError(f"{flag} does not divide the model's {what} {size}; choose a size that divides "
                             f"{size} (and {', '.join(f'{w} {s}' for w, s in sizes.items() if w != what)})")
    kv = arch.num_kv_heads
    if kv % world_size and world_size % kv:
        raise ValueError(f"{flag}: the model's {kv} KV heads can neither be split over {world_size} ranks nor "
                         f"replicated evenly on them; choose a size that divides {kv} or is a multiple of it")


@dataclass(frozen=True)
class TensorShard:
    """Rank ``rank`` of ``world_size``'s part of the model ``arch`` (the whole model's architecture)."""
    rank: int
    world_size: int
    arch: ArchConfig

    def __post_init__(self):
        assert 0 <= self.rank < self.world_size, (self.rank, self.world_size)
        check_shardable(self.arch, self.world_size)

    @property
    def num_heads(self) -> int:
        return self.arch.num_heads // self.world_size

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.arch.num_kv_heads // self.world_size)

    @property
    def kv_head_start(self) -> int:
        return self.rank * self.arch.num_kv_heads // self.world_size

    @property
    def intermediate_size(self) -> int:
        return self.arch.intermediate_size // self.world_size

    @property
    def moe_intermediate_size(self) -> int:
        return self.arch.moe_intermediate_size // self.world_size

    @property
    def shared_expert_intermediate_size(self) -> int:
        return self.arch.shared_expert_intermediate_size // self.world_size

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_size

    @property
    def vocab_size(self) -> int:
        """This rank's rows of the embedding and LM head (the vocabulary padded to a multiple of the ranks)."""
        return -(-self.arch.vocab_size // self.world_size)

    @property
    def padded_vocab_size(self) -> int:
        return self.vocab_size * self.world_size

    @property
    def checkpoint_vocab_rows(self) -> int:
        """Of this rank's rows, those the checkpoint has (the rest pad the vocabulary)."""
        return max(0, min(self.arch.vocab_size - self.vocab_start, self.vocab_size))

    def local_arch(self) -> ArchConfig:
        """The architecture of this rank's layers: its heads, KV heads and MLP widths, its experts' included (the
        vocabulary stays whole: the engine samples over all of it; the vocab-parallel embedding and head hold
        ``vocab_size`` rows)."""
        return dataclasses.replace(self.arch, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                                   intermediate_size=self.intermediate_size,
                                   moe_intermediate_size=self.moe_intermediate_size,
                                   shared_expert_intermediate_size=self.shared_expert_intermediate_size)

    def checkpoint_slices(self) -> dict[str, Slice]:
        """Checkpoint tensor name -> the slice this rank reads (names absent: read whole)."""
        d, r = self.arch.head_dim, self.rank
        q = (r * self.num_heads * d, (r + 1) * self.num_heads * d)
        kv = (self.kv_head_start * d, (self.kv_head_start + self.num_kv_heads) * d)
        mlp = (r * self.intermediate_size, (r + 1) * self.intermediate_size)
        vocab = (self.vocab_start, self.vocab_start + self.checkpoint_vocab_rows)
        out = {"model.embed_tokens.weight": (0, *vocab), "lm_head.weight": (0, *vocab)}
        for i in range(self.arch.num_layers):
            p = f"model.layers.{i}."
            if self.arch.is_mla:
                out.update(self._latent_attention_slices(i))
            else:
                for kind in ("weight", "bias"):
                    out[f"{p}self_attn.q_proj.{kind}"] = (0, *q)
                    out[f"{p}self_attn.k_proj.{kind}"] = (0, *kv)
                    out[f"{p}self_attn.v_proj.{kind}"] = (0, *kv)
                out[f"{p}self_attn.o_proj.weight"] = (1, *q)
            if self.arch.is_moe_layer(i):
                out.update(self._expert_slices(i))
                continue
            out[f"{p}mlp.gate_proj.weight"] = (0, *mlp)
            out[f"{p}mlp.up_proj.weight"] = (0, *mlp)
            out[f"{p}mlp.down_proj.weight"] = (1, *mlp)
        return out

    def _latent_attention_slices(self, layer: int) -> dict[str, Slice]:
        """Latent attention split by heads as vLLM splits it: q_b_proj (or q_proj) and kv_b_proj by the rank's heads'
        rows, o_proj by their value columns; q_a_proj, kv_a_proj_with_mqa and their norms whole, so every rank
        computes the same latent row (the KV pool holds it whole on every rank)."""
        a, heads, r = self.arch, self.num_heads, self.rank
        p = f"model.layers.{layer}.self_attn."
        q_rows = heads * (a.qk_nope_head_dim + a.head_dim)
        kv_rows, v_cols = heads * (a.qk_nope_head_dim + a.v_head_dim), heads * a.v_head_dim
        q_name = "q_b_proj" if a.q_lora_rank else "q_proj"
        return {f"{p}{q_name}.weight": (0, r * q_rows, (r + 1) * q_rows),
                f"{p}kv_b_proj.weight": (0, r * kv_rows, (r + 1) * kv_rows),
                f"{p}o_proj.weight": (1, r * v_cols, (r + 1) * v_cols)}

    def _expert_slices(self, layer: int) -> dict[str, Slice]:
        """An MoE layer's experts: gate and up by rows, down by columns (router and shared-expert gate whole)."""
        mixtral = self.arch.architecture == "mixtral"
        block = f"model.layers.{layer}.{'block_sparse_moe' if mixtral else 'mlp'}."
        gate, up, down = MIXTRAL_EXPERT_NAMES if mixtral else HF_NAMES
        r, width = self.rank, self.moe_intermediate_size
        cols = (r * width, (r + 1) * width)
        out = {}
        for e in range(self.arch.num_experts):
            prefix = f"{block}experts.{e}."
            out.update({f"{prefix}{gate}.weight": (0, *cols), f"{prefix}{up}.weight": (0, *cols),
                        f"{prefix}{down}.weight": (1, *cols)})
        if self.arch.shared_expert_intermediate_size:
            shared = self.shared_expert_intermediate_size
            cols = (r * shared, (r + 1) * shared)
            # Qwen2-MoE's one shared expert; DeepSeek's and GLM's n_shared_experts fused as one (shared_experts)
            name = "shared_expert" if self.arch.architecture == "qwen2_moe" else "shared_experts"
            out.update({f"{block}{name}.gate_proj.weight": (0, *cols),
                        f"{block}{name}.up_proj.weight": (0, *cols),
                        f"{block}{name}.down_proj.weight": (1, *cols)})
        return out
