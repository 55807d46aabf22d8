"""The adapters an engine serves: names, host copies (LRU, ``--max-cpu-loras``) and device slots (``--max-loras``).

Each registered adapter gets an ``AdapterEntry`` with an id never reused in the engine (1, 2, ...; 0 is the base
model): sequences hold their entry, the prefix cache salts their blocks with its id, and a slot is keyed by it.
Unloading a name removes it from the registry only: requests already running keep their entry and finish
with it (its weights are read again from its path if the host cache dropped them). Single-threaded: the engine
thread owns it.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import torch

from gh200rt.lora.peft_adapter import LoraAdapter, read_peft_adapter
from gh200rt.lora.request import LoRARequest
from gh200rt.lora.slots import LoraSlots
from gh200rt.lora.step import NO_SLOT, LoraBatch, lora_step


@dataclass(eq=False)
class AdapterEntry:
    id: int
    name: str
    path: str
    base_model_name: str | None = None


class UnknownAdapter(KeyError):
    """No adapter of that name is loaded."""


class AdapterRegistry:
    def __init__(self, config, arch, dtype: torch.dtype, slots: LoraSlots, batch: LoraBatch, shard=None):
        """``config``: the engine's ``LoRAConfig``; ``arch``: the whole model's (adapters are read and checked
        whole); ``shard``: a tensor-parallel rank's ``TensorShard``, whose slice of each adapter its slots hold."""
        self.config, self.arch, self.dtype, self.shard = config, arch, dtype, shard
        self.slots, self.batch = slots, batch
        # this step's adapters copied into slots, (slot, entry), and per scheduled sequence (slot, tokens): what
        # rank 0 of a tensor-parallel engine sends its workers with the step
        self.step_loads: list[tuple[int, AdapterEntry]] = []
        self.step_runs: list[tuple[int, int]] = []
        self.by_name: dict[str, AdapterEntry] = {}
        self._ids = itertools.count(1)
        self._host: OrderedDict[int, LoraAdapter] = OrderedDict()      # LRU: oldest first
        self._slot_of: OrderedDict[int, int] = OrderedDict()           # adapter id -> slot, LRU: oldest first
        self.slot_loads = 0                                            # adapters copied into a slot since start

    # ---- names ------------------------------------------------------------------------------------
    def read(self, path: str) -> LoraAdapter:
        """Read and check an adapter for this model (no registration; any thread may call it)."""
        return read_peft_adapter(path, self.arch, self.config.max_lora_rank, self.dtype)

    def add(self, name: str, path: str, base_model_name: str | None = None,
            adapter: LoraAdapter | None = None) -> AdapterEntry:
        """Register ``name`` (reading ``path`` unless ``adapter`` is that read); ValueError if the name is taken."""
        if name in self.by_name:
            raise ValueError(f"The lora adapter '{name}' has already been loaded; unload it first "
                             "(/v1/unload_lora_adapter) or pick another name")
        adapter = adapter if adapter is not None else self.read(path)
        entry = AdapterEntry(next(self._ids), name, path, base_model_name)
        self.by_name[name] = entry
        self._keep_on_host(entry.id, adapter)
        return entry

    def remove(self, name: str) -> AdapterEntry:
        entry = self.by_name.pop(name, None)
        if entry is None:
            raise UnknownAdapter(name)
        return entry                # its host copy ages out of the LRU: running requests may still need it

    def resolve(self, name: str) -> AdapterEntry:
        entry = self.by_name.get(name)
        if entry is None:
            raise UnknownAdapter(name)
        return entry

    def entry_for(self, request: LoRARequest | str) -> AdapterEntry:
        """The entry a request runs under: a loaded adapter's name, or a ``LoRARequest`` (whose path is loaded under
        its name first if the name is new, as vLLM's offline API does)."""
        if isinstance(request, str):
            request = LoRARequest(request)
        name, path = request.lora_name, request.lora_path
        entry = self.by_name.get(name)
        if entry is None and path is not None:
            entry = self.add(name, path, request.base_model_name)
        if entry is None:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded (loaded: {sorted(self.by_name)}); give its "
                             "path in the LoRARequest, --lora-modules or /v1/load_lora_adapter")
        if path is not None and path != entry.path:
            raise ValueError(f"the LoRA adapter {name!r} is loaded from {entry.path!r}, not {path!r}; unload it "
                             "first or use another name")
        return entry

    def _keep_on_host(self, adapter_id: int, adapter: LoraAdapter) -> None:
        self._host[adapter_id] = adapter
        self._host.move_to_end(adapter_id)
        while len(self._host) > self.config.cpu_loras:
            self._host.popitem(last=False)

    def host_adapter(self, entry: AdapterEntry) -> LoraAdapter:
        adapter = self._host.get(entry.id)
        if adapter is None:               # dropped by the LRU: read it again
            adapter = self.read(entry.path)
        self._keep_on_host(entry.id, adapter)
        return adapter

    @property
    def host_ids(self) -> list[int]:
        return list(self._host)

    # ---- slots ------------------------------------------------------------------------------------
    def slot_for(self, entry: AdapterEntry, keep: set[int]) -> int:
        """The slot holding ``entry``, loading it first if needed into a free slot or the least recently used
        one whose adapter is not in ``keep`` (the step's other adapters)."""
        slot = self._slot_of.get(entry.id)
        if slot is None:
            taken = set(self._slot_of.values())
            free = [s for s in range(self.config.max_loras) if s not in taken]
            if free:
                slot = free[0]
            else:
                victim = next(i for i in self._slot_of if i not in keep)
                slot = self._slot_of.pop(victim)
            self.load_slot(slot, self.host_adapter(entry))
            self.step_loads.append((slot, entry))
            self.slot_loads += 1
            self._slot_of[entry.id] = slot
        self._slot_of.move_to_end(entry.id)
        return slot

    def begin_step(self, scheduled) -> None:
        """Put the step's adapters in slots and set the step's per-token slots; ``scheduled``: the scheduler's
        ``ScheduledSequence``s (``seq.lora``: an ``AdapterEntry`` or None)."""
        entries = {item.seq.lora.id: item.seq.lora for item in scheduled if item.seq.lora is not None}
        assert len(entries) <= self.config.max_loras, "the scheduler admits at most --max-loras adapters"
        keep = set(entries)
        self.step_loads = []
        slot_of = {i: self.slot_for(entry, keep) for i, entry in entries.items()}
        self.step_runs = [(NO_SLOT if item.seq.lora is None else slot_of[item.seq.lora.id], item.num_new_tokens)
                          for item in scheduled]
        self.batch.step = lora_step(self.step_runs, self.batch.device, self.batch.use_triton)

    def end_step(self) -> None:
        self.batch.step = None

    def load_slot(self, slot: int, adapter: LoraAdapter) -> None:
        """``adapter`` (read whole) into ``slot``: this rank's slice of it where the model is a shard."""
        if self.shard is not None:
            from gh200rt.lora.tp_shard import shard_adapter
            adapter = shard_adapter(adapter, self.shard)
        self.slots.load(slot, adapter)

    @property
    def slot_ids(self) -> dict[int, int]:
        """Adapter id -> device slot, for tests and stats."""
        return dict(self._slot_of)
