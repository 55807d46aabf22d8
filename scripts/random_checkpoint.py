"""Write a Hugging Face model directory of a known shape with random bf16 weights, generated here
(gh200rt/bench/random_model.py; benchmarks write one themselves with ``--random-model SHAPE``).

    python scripts/random_checkpoint.py llama3-8b /tmp/llama3-8b-random
    python scripts/random_checkpoint.py qwen3-30b-a3b-8l /tmp/qwen3-30b-a3b-8l-random      # MoE, 11 GB
    python scripts/random_checkpoint.py mixtral-8x7b /tmp/mixtral-4l --num-layers 4        # 12 GB
    python -m gh200rt.bench latency --random-model llama3-8b [--random-model-dir DIR] ...
"""
from __future__ import annotations

import argparse
import sys

from gh200rt.bench.random_model import SHAPES, write_random_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shape", choices=list(SHAPES))
    parser.add_argument("path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-layers", type=int, default=None,
                        help="cut the shape to this many decoder layers (per-layer shapes, vocabulary and head stay)")
    args = parser.parse_args(argv)
    print(write_random_checkpoint(args.shape, args.path, args.seed, args.num_layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
