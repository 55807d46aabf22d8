"""gh200rt: LLM serving for Grace Hopper — weights in host memory, HBM for the KV cache."""
import pkgutil

# gh200rt.numa and gh200rt.kernels are installed from the top-level numa/ and kernels/ folders
# (setuptools package-dir), so a source checkout that comes first on sys.path (pytest's
# pythonpath, a script run from the checkout) hides them from a regular, non-editable install:
# search every gh200rt folder on sys.path, the installed one included.
__path__ = pkgutil.extend_path(__path__, __name__)

from gh200rt.pooling_params import PoolingParams
from gh200rt.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "PoolingParams", "SamplingParams", "__version__"]


def __getattr__(name):
    if name == "LLM":  # imported lazily: `import gh200rt` stays cheap for tools that only plan
        from gh200rt.engine.llm import LLM
        return LLM
    raise AttributeError(name)
