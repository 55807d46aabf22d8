"""Copy checkpoint tensors into the model's destinations, each exactly once, and fail loudly on
missing, unexpected, partly merged or mis-shaped weights."""
from __future__ import annotations

import logging
import sys

import torch
from tqdm import tqdm

from gh200rt.loader.errors import ModelLoadError

log = logging.getLogger(__name__)

# names some checkpoints carry that hold nothing the model needs
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# tensors kept in the precision the checkpoint stores (float32 in DeepSeek-V3's): the model holds them in float32
FULL_PRECISION_SUFFIXES = (".e_score_correction_bias",)


def mtp_prefixes(arch) -> tuple[str, ...]:
    """Checkpoint prefixes of the multi-token-prediction layers a DeepSeek-V3 checkpoint ships after its decoder
    layers (``model.layers.61.`` for V3): loaded past here; speculative decoding's ``mtp`` method reads the first
    (speculative/mtp.py)."""
    return tuple(f"model.layers.{arch.num_layers + i}." for i in range(arch.num_nextn_predict_layers))


class WeightWriter:
    def __init__(self, model, source: str, total_weights: int, total_bytes: int):
        self.destinations: dict[str, torch.Tensor] = model.weight_destinations()
        self.fused_names: dict[str, str] = model.fused_names()
        self.tied = model.arch.tie_word_embeddings
        self.skipped_prefixes = mtp_prefixes(model.arch)
        self.skipped: list[str] = []
        self.source = source
        self.written: set[str] = set()
        self.unexpected: list[str] = []
        self.bytes_written = 0
        self.progress = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=f"loading {total_weights} weights",
                             disable=not sys.stderr.isatty(), leave=False)

    def expects(self, name: str) -> bool:
        return name in self.destinations

    def expected_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.destinations[name].shape)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        dest = self.destinations.get(name)
        if dest is None and self.skipped_prefixes and name.startswith(self.skipped_prefixes):
            self.skipped.append(name)
            return
        if dest is None:
            if not name.endswith(_IGNORED_SUFFIXES) and not (self.tied and name == "lm_head.weight"):
                self.unexpected.append(name)
            return
        self._check_shape(name, dest, tuple(tensor.shape))
        assert name not in self.written, f"{name} written twice"
        dest.copy_(tensor)
        self.written.add(name)
        self.bytes_written += tensor.numel() * tensor.element_size()
        self.progress.update(tensor.numel() * tensor.element_size())

    def defer(self, name: str, shape: tuple[int, ...]) -> None:
        """Count ``name`` (of ``shape`` in the checkpoint) as written; its bytes are read later
        (loader/deferred_layers.py)."""
        self._check_shape(name, self.destinations[name], tuple(shape))
        assert name not in self.written, f"{name} written twice"
        self.written.add(name)

    def _check_shape(self, name: str, dest: torch.Tensor, shape: tuple[int, ...]) -> None:
        if tuple(dest.shape) != shape:
            raise ModelLoadError(f"{self.source}: weight {name} has shape {shape} but the model "
                                 f"config needs {tuple(dest.shape)}; the checkpoint does not match its config.json")

    def finish(self, source_name=None) -> None:
        """Raise ``ModelLoadError`` naming every missing, partly merged or unexpected weight; ``source_name`` maps a
        missing weight's name to the file's name for it (a GGUF expert stack holds many), each named once."""
        self.progress.close()
        if self.skipped:
            log.info("%s: skipped the %d weights of the multi-token-prediction layer (%s); it drafts with "
                     "--speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'", self.source,
                     len(self.skipped), ", ".join(p.rstrip(".") for p in self.skipped_prefixes))
        missing = [n for n in self.destinations if n not in self.written]
        problems = []
        if missing:
            partial = sorted({self.fused_names[n] for n in missing if n in self.fused_names
                              and any(o in self.written for o, f in self.fused_names.items()
                                      if f == self.fused_names[n])})
            if source_name is not None:
                missing = list(dict.fromkeys(source_name(n) for n in missing))
            problems.append(f"missing weights: {_short(missing)}")
            if partial:
                problems.append(f"partly merged (some parts present, some missing): {_short(partial)}")
        if self.unexpected:
            problems.append(f"unexpected weights the model does not use: {_short(self.unexpected)}")
        if problems:
            raise ModelLoadError(f"{self.source}: " + "; ".join(problems))


def _short(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... and {len(names) - limit} more" if len(names) > limit else "")
