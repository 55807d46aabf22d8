"""Device-memory ledger: the one account of what sits in HBM (or its CPU stand-in).

Contract: capacity = --device-memory-budget when given, else free device memory x
--gpu-memory-utilization; on the CPU platform without a budget, what the model needs all-resident
plus up to 2 GiB for the KV cache (so the CPU default never streams layers). ``reserve(kind, nbytes)`` either fits or raises
``LedgerOverCommit`` naming the numbers and the flag to change; ``release`` gives bytes back;
``peak`` is the highest total ever reserved.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config import MemoryConfig

# kv_pool and arena_weights split one device arena: blocks move between them as layers change tier;
# cpu_route_forms: what the CPU routes' forms of resident linears hold beside their own bytes (the fp32 routes'
# reordered copies, the fp16+gguf route's GGUF blocks); lora_slots: the --max-loras LoRA adapter slots;
# direct_scales: the quantization scales of DIRECT layers kept in device memory (--direct-scales device);
# draft_weights / draft_kv: speculative decoding's draft model and its KV cache (the pool's blocks)
KINDS = ("resident_weights", "arena_weights", "staging_ring", "kv_pool", "activations", "graph_pools", "direct_scales",
         "cpu_route_forms", "lora_slots", "draft_weights", "draft_kv")
CPU_DEFAULT_KV_BYTES = 2 << 30


class LedgerOverCommit(ValueError):
    """A reservation would exceed the device budget; the message names the numbers and the flag."""


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.3f} GiB"


def ledger_capacity(memory: MemoryConfig, free_device_bytes: int | None, all_resident_bytes: int = 0,
                    useful_kv_bytes: int = CPU_DEFAULT_KV_BYTES) -> int:
    """Bytes the ledger may hand out. ``free_device_bytes`` is None when the engine runs on the CPU;
    there the default is ``all_resident_bytes`` (weights + activations with every layer resident) plus
    the KV cache, at most 2 GiB and at most ``useful_kv_bytes`` (every sequence at full length)."""
    if memory.budget_bytes is not None:
        return memory.budget_bytes
    if free_device_bytes is None:
        return all_resident_bytes + min(CPU_DEFAULT_KV_BYTES, useful_kv_bytes)
    return int(free_device_bytes * memory.gpu_memory_utilization)


@dataclass
class DeviceMemoryLedger:
    capacity: int
    by_kind: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    peak: int = 0

    @property
    def used(self) -> int:
        return sum(self.by_kind.values())

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def reserve(self, kind: str, nbytes: int) -> None:
        if kind not in self.by_kind:
            raise ValueError(f"unknown ledger kind {kind!r}: choose one of {', '.join(KINDS)}")
        assert nbytes >= 0, nbytes
        if self.used + nbytes > self.capacity:
            lines = ", ".join(f"{k} {_gib(v)}" for k, v in self.by_kind.items() if v)
            raise LedgerOverCommit(
                f"device memory over-committed: {kind} needs {_gib(nbytes)} but only {_gib(self.free)} of "
                f"{_gib(self.capacity)} is free (in use: {lines or 'nothing'}); raise --device-memory-budget "
                f"(or --gpu-memory-utilization), lower --kv-cache-min-tokens, or offload more layers "
                f"(--offload stream)")
        self.by_kind[kind] += nbytes
        self.peak = max(self.peak, self.used)

    def release(self, kind: str, nbytes: int) -> None:
        assert 0 <= nbytes <= self.by_kind[kind], (kind, nbytes, self.by_kind[kind])
        self.by_kind[kind] -= nbytes

    def summary(self) -> dict[str, int]:
        return {**self.by_kind, "capacity": self.capacity, "used": self.used, "peak": self.peak}
