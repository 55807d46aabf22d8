"""``EngineConfig``: every section composed, the checks that span sections, and the values derived from
several of them."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.cache import CacheConfig
from gh200rt.config.graphs import MAX_GRAPH_BATCH, GraphConfig
from gh200rt.config.lora import LoRAConfig
from gh200rt.config.memory import MemoryConfig
from gh200rt.config.model import ModelConfig
from gh200rt.config.parallel import ParallelConfig
from gh200rt.config.scheduler import SchedulerConfig
from gh200rt.config.speculative import SpeculativeConfig


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    graphs: GraphConfig = field(default_factory=GraphConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)

    def __post_init__(self):
        if self.lora.enable_lora and self.graphs.enforce_eager is False:
            raise ValueError("--enable-lora runs every step eagerly (decode graphs do not hold the per-token adapter "
                             "inputs yet): drop --no-enforce-eager")
        if self.cache.kv_offloading_disk_dir is not None and self.parallel.tensor_parallel_size > 1:
            raise ValueError("--kv-offloading-disk-dir with --tensor-parallel-size > 1 is not supported yet (each "
                             "rank's share of a block would need its own file): drop one of the two")
        drafted = self.speculative.method
        if self.cache.kv_offloading_reads == "in_place" and drafted is not None and drafted.method == "draft_model":
            raise ValueError("--kv-offloading-reads in_place with the draft_model method is not supported yet (the "
                             "draft computes its KV over every prompt position and keeps none for blocks read in "
                             "place): use load or auto, or an eagle3, mtp, ngram or suffix draft")

    @property
    def max_graph_batch(self) -> int:
        """The most rows a decode graph holds: ``--max-graph-batch``, at most ``--max-num-seqs`` rows, or with
        speculative decoding as many times 1 + k (a verifying sequence's row per position)."""
        wanted = self.graphs.max_graph_batch or MAX_GRAPH_BATCH
        method = self.speculative.method
        per_sequence = 1 + method.num_speculative_tokens if method is not None else 1
        return min(wanted, self.scheduler.max_num_seqs * per_sequence)

    def use_graphs(self, device_type: str) -> bool:
        """Decode steps go through the bucketed graph path: on by default on a GPU, off on the CPU."""
        if self.lora.enable_lora:       # decode graphs do not hold the per-token adapter inputs (docs/LORA.md)
            return False
        if self.graphs.enforce_eager is None:
            return device_type == "cuda"
        return not self.graphs.enforce_eager

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        """Flat keyword arguments (as ``LLM(...)`` takes them) -> nested config; unknown names raise."""
        parts = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig, "memory": MemoryConfig,
                 "graphs": GraphConfig, "parallel": ParallelConfig, "lora": LoRAConfig,
                 "speculative": SpeculativeConfig}
        values: dict[str, dict] = {name: {} for name in parts}
        owners = {f: name for name, klass in parts.items() for f in klass.__dataclass_fields__}
        for key, value in kwargs.items():
            if key not in owners:
                raise TypeError(f"unknown engine option {key!r}; known options: {', '.join(sorted(owners))}")
            values[owners[key]][key] = value
        return cls(**{name: klass(**values[name]) for name, klass in parts.items()})
