"""Model loading: ``load_model(ModelConfig) -> LoadedModel`` from a Hugging Face directory, a GGUF file or an
alias; strict about weights (``ModelLoadError`` names what is missing, unexpected or malformed)."""
from gh200rt.loader.errors import ModelLoadError
from gh200rt.loader.load import LoadedModel, load_model

__all__ = ["LoadedModel", "ModelLoadError", "load_model"]
