"""A Llama-family model (Llama, Mistral, Qwen2, Qwen3, the MoE families, DeepSeek's latent attention) holding one
rank's shard (``sharding.py``).

It is the single-rank model built from the rank's local architecture (its heads, KV heads and MLP widths), with
these changes: o_proj and a dense layer's down_proj are ``RowParallelLinear`` (partial sums, one all-reduce each);
an MoE layer's block is a ``RowParallelMoeBlock``: each expert's down_proj (and the shared expert's) gives a partial
sum over the rank's intermediate columns, and the block's output — the routed experts' weighted sum plus the gated
shared expert — is all-reduced once (every term is linear in the partial sums: the routing weights and the shared
expert's gate are the same on every rank). The router is replicated and reads the same hidden state on every rank
(the residual stream is the output of all-reduces, which hand every rank the same bits), so every rank routes every
token to the same experts with the same weights. The embedding holds the rank's vocabulary rows (a token outside
them embeds as zeros, and the all-reduce sums the one rank that has it); the LM head computes the rank's logits,
gathered on rank 0. Where N does not divide the vocabulary, each rank holds ceil(V/N) rows and the last rows of the
last rank(s) pad it: zeros that no token id reaches, whose logits rank 0 cuts off after the gather, so no padded id
can be sampled. The collectives need the rank's ``ParallelState``, which exists once every rank has loaded:
``connect`` hands it to the model before its first step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gh200rt.distributed.parallel_state import ParallelState
from gh200rt.distributed.sharding import TensorShard
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.layers.linear import RefLinear
from gh200rt.models.llama import LlamaForCausalLM
from gh200rt.models.moe import SparseMoeBlock


class RowParallelLinear(RefLinear):
    """A linear over this rank's input columns: its output, summed over the ranks, is the whole layer's."""
    state: ParallelState | None = None

    def forward(self, x: torch.Tensor, block_rows: int | None = None) -> torch.Tensor:
        return self.state.all_reduce(super().forward(x, block_rows))


class RowParallelMoeBlock(SparseMoeBlock):
    """An MoE block over this rank's columns of every expert: its output, summed over the ranks, is the block's."""
    state: ParallelState | None = None

    def forward(self, x: torch.Tensor, block_rows: int | None = None) -> torch.Tensor:
        return self.state.all_reduce(super().forward(x, block_rows))


class ShardedLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, shard: TensorShard, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        arch = shard.local_arch()
        super().__init__(arch, dtype, device)
        self.shard = shard
        self.state: ParallelState | None = None
        hidden = arch.hidden_size
        self.embed_tokens = nn.Parameter(torch.empty(shard.vocab_size, hidden, dtype=dtype, device=device),
                                         requires_grad=False)
        self.lm_head = RefLinear(hidden, shard.vocab_size, False, dtype, device)
        if arch.tie_word_embeddings:
            self.lm_head.weight_ref.current = self.embed_tokens
        real = shard.checkpoint_vocab_rows
        with torch.no_grad():
            self.embed_tokens[real:].zero_()
            self.lm_head.weight_ref.current[real:].zero_()
        for layer in self.layers:
            # the rank's heads' values (latent attention's are v_head_dim wide, not head_dim)
            values = layer.self_attn.o_proj.weight_ref.shape[1]
            layer.self_attn.o_proj = RowParallelLinear(values, hidden, False, dtype, device)
            if layer.sparse:
                layer.mlp = RowParallelMoeBlock(arch, dtype, device)
            else:
                layer.mlp.down_proj = RowParallelLinear(shard.intermediate_size, hidden, False, dtype, device)

    def connect(self, state: ParallelState) -> None:
        """Give the model its rank's process groups, and keep every decoder layer op by op: the native one-call
        decode layer (and the stack of them) has no place for the all-reduces."""
        assert state.rank == self.shard.rank and state.world_size == self.shard.world_size, (state, self.shard)
        self.state = state
        self.decode_stack_fn = None
        for layer in self.layers:
            layer.self_attn.o_proj.state = state
            if layer.sparse:
                layer.mlp.state = state
            else:
                layer.mlp.down_proj.state = state
            layer.decode_layer_fn = None

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        local = input_ids - self.shard.vocab_start
        outside = (local < 0) | (local >= self.shard.vocab_size)
        hidden = F.embedding(local.masked_fill(outside, 0), self.embed_tokens)
        hidden = self.state.all_reduce(hidden.masked_fill(outside.unsqueeze(-1), 0))
        return hidden, self.rotary.tables(positions, hidden.dtype)

    def weight_destinations(self) -> dict[str, torch.Tensor]:
        """The single-rank model's, with the embedding and LM head cut to the rows the checkpoint has."""
        dest = super().weight_destinations()
        real = self.shard.checkpoint_vocab_rows
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in dest:
                dest[name] = dest[name][:real]
        return dest

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The whole vocabulary's logits on rank 0, without the padding rows' (this rank's on the others)."""
        logits = self.state.gather_last_dim(self.lm_head(hidden).float())
        vocab = self.arch.vocab_size
        return logits[..., :vocab].contiguous() if self.state.is_first and logits.shape[-1] != vocab else logits


def build_sharded_model(shard: TensorShard, arch: ArchConfig, dtype, device) -> ShardedLlamaForCausalLM:
    """The uninitialised model of ``shard``'s rank for ``arch`` (which must be the one ``shard`` was made for)."""
    if arch != shard.arch:
        raise ValueError(f"the checkpoint's architecture changed since the ranks started: {arch} vs {shard.arch}")
    with torch.inference_mode(False):
        return ShardedLlamaForCausalLM(shard, dtype, device).eval()
