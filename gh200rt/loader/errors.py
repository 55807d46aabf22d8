"""The one error type a user sees when a model cannot be loaded."""
from __future__ import annotations


class ModelLoadError(ValueError):
    """A model path, alias, file or weight set is not usable; the message says which and why."""
