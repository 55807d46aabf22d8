"""gh200rt: LLM serving for Grace Hopper — weights in host memory, HBM for the KV cache."""
from gh200rt.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name):
    if name == "LLM":  # imported lazily: `import gh200rt` stays cheap for tools that only plan
        from gh200rt.engine.llm import LLM
        return LLM
    raise AttributeError(name)
