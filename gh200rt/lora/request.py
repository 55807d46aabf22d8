"""What names an adapter: vLLM's ``LoRARequest`` (offline API) and ``--lora-modules`` entries."""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """vLLM's offline handle: ``LLM.generate(..., lora_request=LoRARequest("sql", 1, "/adapters/sql"))``. The id is
    vLLM's; gh200rt numbers adapters itself and keys them by name (the same name with another path is refused)."""
    lora_name: str
    lora_int_id: int = 0
    lora_path: str | None = None
    base_model_name: str | None = None


@dataclass(frozen=True)
class LoRAModulePath:
    name: str
    path: str
    base_model_name: str | None = None


def _one_module(text: str) -> LoRAModulePath:
    text = text.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--lora-modules: {text!r} is not valid JSON ({e}); write name=path or "
                             '{"name": "sql", "path": "/adapters/sql"}') from e
        extra = set(spec) - {"name", "path", "base_model_name"}
        if not isinstance(spec.get("name"), str) or not isinstance(spec.get("path"), str) or extra:
            raise ValueError(f"--lora-modules: {text!r} needs string 'name' and 'path' (and optionally "
                             f"'base_model_name'){'; unknown keys ' + ', '.join(sorted(extra)) if extra else ''}")
        module = LoRAModulePath(spec["name"], spec["path"], spec.get("base_model_name"))
    else:
        name, sep, path = text.partition("=")
        if not sep:
            raise ValueError(f"--lora-modules: {text!r} is not name=path (example: --lora-modules "
                             "sql=/adapters/sql-lora)")
        module = LoRAModulePath(name.strip(), path.strip())
    if not module.name or not module.path:
        raise ValueError(f"--lora-modules: {text!r} needs a non-empty name and path")
    return module


def parse_lora_modules(entries: tuple[str, ...]) -> tuple[LoRAModulePath, ...]:
    modules = tuple(_one_module(entry) for entry in entries)
    names = [m.name for m in modules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"--lora-modules names {', '.join(dupes)} more than once; give each adapter its own name")
    return modules
