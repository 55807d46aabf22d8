"""``LoRAConfig``: the LoRA adapters served beside the base model."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.config.flags import flag_help


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters (vLLM's flags; docs/LORA.md). ``lora_modules`` entries are ``name=path`` or vLLM's JSON form
    ``{"name": ..., "path": ..., "base_model_name": ...}``; ``modules`` reads them."""
    enable_lora: bool = field(default=False, metadata=flag_help(
        "serve LoRA adapters (PEFT directories) beside the base model; a request picks one by its 'model' name"))
    lora_modules: tuple[str, ...] | None = field(default=None, metadata={
        "help": "adapters to load at start: name=path or JSON {\"name\": ..., \"path\": ..., \"base_model_name\": "
                "...}; needs --enable-lora", "nargs": "+"})
    max_loras: int = field(default=1, metadata=flag_help(
        "adapters in one step: device slots booked in the ledger (requests for further adapters wait)"))
    max_lora_rank: int = field(default=16, metadata=flag_help(
        "largest adapter rank r accepted (sizes the device slots)"))
    max_cpu_loras: int | None = field(default=None, metadata=flag_help(
        "adapters whose weights stay in host memory (least recently used ones are read again from disk when "
        "needed); default: --max-loras, and at least --max-loras"))
    enable_runtime_lora_updating: bool = field(default=False, metadata=flag_help(
        "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)"))

    def __post_init__(self):
        if isinstance(self.lora_modules, str):
            object.__setattr__(self, "lora_modules", (self.lora_modules,))
        if self.lora_modules is not None:
            object.__setattr__(self, "lora_modules", tuple(self.lora_modules))
        needs = [flag for flag, given in (("--lora-modules", self.lora_modules),
                                          ("--enable-runtime-lora-updating", self.enable_runtime_lora_updating))
                 if given]
        if needs and not self.enable_lora:
            raise ValueError(f"{' and '.join(needs)} serve LoRA adapters: add --enable-lora")
        if self.max_loras < 1:
            raise ValueError(f"--max-loras must be at least 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"--max-lora-rank must be at least 1, got {self.max_lora_rank} (vLLM's default is 16)")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"--max-cpu-loras ({self.max_cpu_loras}) must be at least --max-loras "
                             f"({self.max_loras}): the adapters of a step are copied from host memory")
        self.modules  # noqa: B018 -- each entry is checked here, once

    @property
    def modules(self):
        """The ``--lora-modules`` entries as ``LoRAModulePath``s (names unique)."""
        from gh200rt.lora.request import parse_lora_modules
        return parse_lora_modules(self.lora_modules or ())

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras or self.max_loras
