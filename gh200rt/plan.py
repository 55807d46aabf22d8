"""``python -m gh200rt.plan``: plan a deployment for a named hardware profile, no hardware needed.

Reads only ``config.json`` from the model directory (weights need not be present).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gh200rt.cli_args import add_dataclass_arguments, dataclass_from_args
from gh200rt.config import MemoryConfig
from gh200rt.memory.ledger import ledger_capacity
from gh200rt.models.arch_config import ArchConfig
from gh200rt.planner.cost_model import model_sizes
from gh200rt.planner.planner import PlanDoesNotFit, make_plan
from gh200rt.platform.detect import detect


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gh200rt.plan", description=__doc__)
    parser.add_argument("--model", required=True, help="directory holding config.json (or the file itself)")
    parser.add_argument("--dtype", default="bf16", help="weight dtype on device: bf16, fp16, fp32")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1, help="expected decode batch for the cost model")
    add_dataclass_arguments(parser, MemoryConfig, "memory")
    args = parser.parse_args(argv)
    path = Path(args.model)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        parser.error(f"--model {args.model}: no config.json found there")
    try:
        memory = dataclass_from_args(MemoryConfig, args)
        platform = detect(memory.platform)
        arch = ArchConfig.from_hf_config(json.loads(path.read_text()))
        sizes = model_sizes(arch, args.dtype)
        free = None if platform.kind == "cpu" else platform.device_memory_bytes
        plan = make_plan(sizes, platform, memory, ledger_capacity(memory, free), args.block_size, args.batch)
    except (ValueError, PlanDoesNotFit) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(plan.explain())
    return 0


if __name__ == "__main__":
    sys.exit(main())
