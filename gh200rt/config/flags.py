"""What the config sections share: ``flag_help`` (a field's help text, which ``gh200rt.cli_args`` gives the flag it
generates for the field) and the parsers of options written as text: sizes (``parse_size``) and per-layer tier
lists (``parse_layer_tiers``, whose tier names are ``TIERS``)."""
from __future__ import annotations

import re

from gh200rt.weights.tiers import LAYER_TIERS as LAYER_TIER_MEMBERS
from gh200rt.weights.tiers import Tier

TIERS = tuple(tier.value for tier in Tier)
LAYER_TIERS = tuple(tier.value for tier in LAYER_TIER_MEMBERS)   # a decoder layer's; cpu is a routed expert's

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_size(text: str | int | None, flag: str = "size") -> int | None:
    """'2GiB' -> 2147483648, '512MB' -> 512000000, 1024 -> 1024, None -> None."""
    if text is None or isinstance(text, int):
        if isinstance(text, int) and text <= 0:
            raise ValueError(f"{flag} must be positive, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise ValueError(f"{flag}: cannot read {text!r} as a size; write e.g. 2GiB, 512MiB, 8GB or a byte count")
    value = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise ValueError(f"{flag} must be positive, got {text!r}")
    return value


def parse_layer_tiers(text: str | None, experts: bool = False) -> dict[int, str]:
    """'0-3:streamed,7:direct' -> {0: 'streamed', 1: ..., 7: 'direct'}; with ``experts``, the parts that place an
    MoE layer's routed experts instead: '0-3:experts=direct' -> {0: 'direct', ...} (the layers' own parts are
    skipped, and the other way round)."""
    if not text:
        return {}
    tiers: dict[int, str] = {}
    for part in text.split(","):
        layers, sep, tier = part.strip().partition(":")
        expert_part = tier.startswith("experts=")
        tier = tier.removeprefix("experts=")
        if not sep or tier not in TIERS:
            raise ValueError(f"--layer-tiers: {part!r} is not LAYERS:TIER or LAYERS:experts=TIER with TIER one of "
                             f"{', '.join(TIERS)} (example: --layer-tiers 0-3:streamed,7:direct,0-47:experts=direct)")
        if tier == Tier.CPU and not expert_part:
            raise ValueError(f"--layer-tiers: {part!r}: a layer's own weights are {', '.join(LAYER_TIERS)}; cpu "
                             f"places an MoE layer's routed experts (LAYERS:experts=cpu)")
        if expert_part != experts:
            continue
        lo, _, hi = layers.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--layer-tiers: {layers!r} is not a layer index or range like 4-9")
        for i in range(int(lo), int(hi or lo) + 1):
            tiers[i] = tier
    return tiers


def flag_help(text: str, **extra) -> dict:
    return {"help": text, **extra}
