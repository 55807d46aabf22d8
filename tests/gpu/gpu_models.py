"""A tiny random Llama on a device, and its layers placed STREAMED or DIRECT through the real pieces:
exact-size host slabs, ``prepare_slab_for_device``, ``make_transfer_backend`` staging slots,
``device_view`` / ``direct_weight`` and the weight store's ``StreamingSchedule``; the layers are placed
by hand (not by ``WeightStore``) so each test pins one piece; ``Steps`` drives the schedule's hooks as
the model runner does.
Imports nothing CUDA-only: callers are marked ``gpu`` and skipped without one."""
from __future__ import annotations

import torch

from gh200rt.engine.model_runner import forward
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.base import AttentionMetadata
from gh200rt.models.llama import LlamaForCausalLM
from gh200rt.numa.alloc import allocate
from gh200rt.transfer.backend import make_transfer_backend
from gh200rt.weights.device_view import device_view, direct_weight, prepare_slab_for_device
from gh200rt.weights.schedule import NULL_HOOKS, StreamingSchedule
from gh200rt.weights.tiers import slot_of

BLOCK = 16
ALIGN = 64


def tiny_arch(qk_norm: bool = False, num_layers: int = 6) -> ArchConfig:
    return ArchConfig("qwen3" if qk_norm else "llama", hidden_size=256, intermediate_size=512,
                      num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=300,
                      qk_norm=qk_norm)


def tiny_model(arch: ArchConfig, dtype: torch.dtype, device, seed: int = 0) -> LlamaForCausalLM:
    model = LlamaForCausalLM(arch, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in sorted(model.weight_destinations().items()):
        values = torch.rand(tensor.shape, generator=gen) + 0.5 if "norm" in name else \
            torch.randn(tensor.shape, generator=gen) * 0.1
        tensor.copy_(values.to(dtype))
    return model


class Steps:
    """Prefill then decode one sequence through a paged KV cache on ``device``."""

    def __init__(self, model, device, num_blocks: int = 8, hooks=NULL_HOOKS):
        arch = model.arch
        self.model, self.device, self.hooks = model, device, hooks
        self.kv = [torch.zeros(2, num_blocks, BLOCK, arch.num_kv_heads, arch.head_dim, dtype=model.dtype, device=device)
                   for _ in range(arch.num_layers)]
        self.table = list(range(num_blocks - 1, 0, -1))

    def meta(self, query: int, seq: int) -> AttentionMetadata:
        return AttentionMetadata.build([query], [seq], [self.table[:-(-seq // BLOCK)]], BLOCK, self.device)

    @torch.inference_mode()
    def run(self, ids: list[int], query: int) -> torch.Tensor:
        """Feed the last ``query`` of ``ids``; logits of those tokens."""
        meta = self.meta(query, len(ids))
        tokens = torch.tensor(ids[-query:], device=self.device)
        hidden = forward(self.model, tokens, meta.positions(self.device), meta, self.kv, self.hooks)
        return self.model.compute_logits(hidden)

    def greedy(self, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
        """Greedy continuation: (prompt + chosen ids, logits of every fed token)."""
        ids, logits = list(prompt), [self.run(prompt, len(prompt))]
        for _ in range(steps):
            ids.append(int(logits[-1][-1].argmax()))
            logits.append(self.run(ids, 1))
        return ids, torch.cat(logits)

    def forced(self, ids: list[int], prompt_len: int) -> torch.Tensor:
        """Prefill ``ids[:prompt_len]``, then decode the rest of ``ids`` one by one (teacher forcing, so a
        near-tie in another run's argmax cannot send this one down a different continuation)."""
        logits = [self.run(ids[:prompt_len], prompt_len)]
        logits += [self.run(ids[:n], 1) for n in range(prompt_len + 1, len(ids) + 1)]
        return torch.cat(logits)


def _slab_for_layer(model, index: int, platform):
    """One exact-size host slab holding the layer's linear weights back to back (64-byte aligned)."""
    refs = model.layer_weight_refs(index)
    layout, offset = [], 0
    for name, ref in refs.items():
        offset = -(-offset // ALIGN) * ALIGN
        layout.append((name, ref.current.shape, ref.current.dtype, offset))
        offset += ref.current.nbytes
    slab = allocate(offset, node=None, policy="default")
    for name, _, _, start in layout:
        src = refs[name].current.contiguous().view(-1).view(torch.uint8).cpu()
        slab.tensor[start:start + src.numel()].copy_(src)
    prepare_slab_for_device(slab, platform)
    return slab, layout


def _typed_views(buffer: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape, dtype, start in layout:
        nbytes = shape.numel() * dtype.itemsize
        out[name] = buffer[start:start + nbytes].view(dtype).view(shape)
    return out


def stream_layers(model, layers: list[int], platform, slots: int, distance: int, poison: bool = True,
                  wrap_steps: bool = True):
    """Make ``layers`` STREAMED through a ring of ``slots``; returns (backend, slabs, schedule), the schedule
    being the hooks to run the model with (``Steps(model, device, hooks=schedule)``)."""
    placed = {i: _slab_for_layer(model, i, platform) for i in layers}
    slot_bytes = max(slab.nbytes for slab, _ in placed.values())
    backend = make_transfer_backend(model.embed_tokens.device, slot_bytes, slots, poison)

    def bind(order: list[int]) -> None:
        for p, i in enumerate(order):
            refs = model.layer_weight_refs(i)
            for name, view in _typed_views(backend.slots[slot_of(p, slots)], placed[i][1]).items():
                refs[name].current = view

    slabs = {i: slab for i, (slab, _) in placed.items()}
    schedule = StreamingSchedule(backend, distance, lambda i: slabs[i].tensor, bind, wrap_steps=wrap_steps)
    schedule.set_orders(layers)
    return backend, slabs, schedule


def direct_layers(model, layers: list[int], platform) -> dict:
    """Make ``layers`` DIRECT: their weights are read in place from host slabs; returns the slabs."""
    slabs = {}
    device = model.embed_tokens.device
    for i in layers:
        slab, layout = _slab_for_layer(model, i, platform)
        refs = model.layer_weight_refs(i)
        for name, view in _typed_views(device_view(slab, platform, device), layout).items():
            refs[name].current = direct_weight(view)
        slabs[i] = slab
    return slabs
