"""A tensor-parallel worker's LoRA: its slots hold its slice of the adapters rank 0 puts in each slot.

Rank 0's ``AdapterRegistry`` decides everything (which adapter goes to which slot, when, and each sequence's slot);
it publishes each adapter's path in the rendezvous store (``lora/<adapter id>``) and sends a step's slot loads and
per-sequence slots with the step (``step_channel.py``). The worker reads the adapter whole from that path (the same
checks as rank 0's), cuts its rank's slice (``lora/tp_shard.py``) into the slot, and sets the step's slots on its
LoRA linears: column-parallel deltas are its rows of the full delta, row-parallel ones partial sums that join the
base output before the layer's all-reduce. An adapter's path must therefore be readable on every host of the ranks.
"""
from __future__ import annotations

import json

from gh200rt.lora.install import install_lora
from gh200rt.lora.step import lora_step


class WorkerAdapters:
    def __init__(self, placed, config, shard, device, store):
        loaded = placed.loaded
        self.registry = install_lora(loaded.model, loaded.arch, config.lora, loaded.dtype, device, placed.ledger,
                                     shard, register_modules=False)
        self.store = store

    def begin(self, step) -> None:
        """Copy the step's new adapters into their slots and give the LoRA linears the step's slots."""
        registry = self.registry
        for slot, adapter_id in step.lora_loads:
            published = json.loads(self.store.get(f"lora/{adapter_id}"))
            registry.load_slot(slot, registry.read(published["path"]))
        batch = registry.batch
        batch.step = lora_step(step.lora_runs, batch.device, batch.use_triton) if step.lora_runs else None

    def end(self) -> None:
        self.registry.batch.step = None
