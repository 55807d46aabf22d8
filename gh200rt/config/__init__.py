"""Frozen, validated configuration. Composes model -> cache -> scheduler -> memory -> engine.

Every field carries its help text in ``metadata["help"]``; the command-line flags of
``generate``, ``serve`` and ``plan`` are generated from these fields (``gh200rt.cli_args``),
so flags and config never drift. Invalid values raise ``ValueError`` naming the flag.

One module per section: ``model.py`` (``ModelConfig``), ``cache.py`` (``CacheConfig``), ``scheduler.py``
(``SchedulerConfig``), ``memory.py`` (``MemoryConfig``), ``graphs.py`` (``GraphConfig``), ``parallel.py``
(``ParallelConfig``), ``lora.py`` (``LoRAConfig``), ``speculative.py`` (``SpeculativeConfig``); ``engine.py``
composes them into ``EngineConfig``, and
``flags.py`` holds what they share (help metadata, the size and layer-tier parsers). Every public name is
imported from here: ``from gh200rt.config import EngineConfig``.
"""
from gh200rt.config.cache import KV_CACHE_DTYPES, CacheConfig
from gh200rt.config.engine import EngineConfig
from gh200rt.config.flags import TIERS, parse_layer_tiers, parse_size
from gh200rt.config.graphs import MAX_GRAPH_BATCH, GraphConfig
from gh200rt.config.lora import LoRAConfig
from gh200rt.config.memory import HOST_WEIGHT_DTYPES, MOE_EXPERT_TIERS, OFFLOAD_MODES, MemoryConfig
from gh200rt.config.model import CPU_KERNELS, CPU_ROUTES, DEFAULT_MODEL, DTYPES, POOLING_TYPES, ModelConfig
from gh200rt.config.parallel import ParallelConfig
from gh200rt.config.scheduler import SchedulerConfig
from gh200rt.config.speculative import SpeculativeConfig, SpeculativeMethod, read_speculative_config

__all__ = [
    "CPU_KERNELS", "CPU_ROUTES", "DEFAULT_MODEL", "DTYPES", "HOST_WEIGHT_DTYPES", "KV_CACHE_DTYPES", "MAX_GRAPH_BATCH",
    "MOE_EXPERT_TIERS", "OFFLOAD_MODES", "POOLING_TYPES", "TIERS",
    "CacheConfig", "EngineConfig", "GraphConfig", "LoRAConfig", "MemoryConfig", "ModelConfig", "ParallelConfig",
    "SchedulerConfig", "SpeculativeConfig", "SpeculativeMethod", "parse_layer_tiers", "parse_size",
    "read_speculative_config",
]
