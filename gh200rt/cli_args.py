"""Command-line flags generated from the config dataclasses, so flags and config never drift."""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing


def _base_type(tp):
    if isinstance(tp, str):
        tp = eval(tp, {"int": int, "float": float, "str": str, "bool": bool, "None": None})  # noqa: S307
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, group_title: str | None = None) -> None:
    """One ``--flag-name`` per field of ``cls``; booleans get ``--flag`` / ``--no-flag``."""
    group = parser.add_argument_group(group_title or cls.__name__)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        tp = _base_type(f.type)
        if tp is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                               help=help_text)
        elif f.metadata.get("nargs"):          # several values: ``--flag a b c`` -> a tuple of them
            group.add_argument(flag, dest=f.name, type=str, nargs=f.metadata["nargs"], default=default,
                               help=f"{help_text} (default: {default})")
        else:
            group.add_argument(flag, dest=f.name, type=tp, default=default, choices=f.metadata.get("choices"),
                               help=f"{help_text} (default: {default})")


def dataclass_from_args(cls, args: argparse.Namespace):
    """Build ``cls`` from parsed flags; nested dataclass fields are built recursively."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        nested = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if nested is not None and dataclasses.is_dataclass(nested):
            kwargs[f.name] = dataclass_from_args(nested, args)
        elif hasattr(args, f.name):
            kwargs[f.name] = getattr(args, f.name)
    return cls(**kwargs)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    from gh200rt.config import (CacheConfig, GraphConfig, LoRAConfig, MemoryConfig, ModelConfig, ParallelConfig,
                                SchedulerConfig, SpeculativeConfig)
    for cls, title in ((ModelConfig, "model"), (CacheConfig, "KV cache"), (SchedulerConfig, "scheduler"),
                       (MemoryConfig, "memory placement"), (GraphConfig, "CUDA graphs"),
                       (ParallelConfig, "parallelism"), (LoRAConfig, "LoRA adapters"),
                       (SpeculativeConfig, "speculative decoding")):
        add_dataclass_arguments(parser, cls, title)


def engine_config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """EngineConfig from flags; a ValueError becomes a usage error naming the problem (exit 2)."""
    from gh200rt.config import EngineConfig
    try:
        return dataclass_from_args(EngineConfig, args)
    except ValueError as e:
        parser.error(str(e))
