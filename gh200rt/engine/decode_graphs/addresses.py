"""DESIGN.md invariant 3: every address a CUDA graph can see is allocated before capture and never moves.

``graph_addresses(...)`` names each tensor a bucketed decode step reads or writes (input buffers,
KV caches, the model's parameters and buffers, every decoder layer's current weights, staging slots)
with its (data pointer, bytes): storage, never the identity of the Python object wrapping it. The runner records this at capture and, with
``--check-graph-addresses``, compares before every replay: a graph replayed over a moved tensor
would read freed memory or write the KV cache somewhere else, silently.
"""
from __future__ import annotations

import torch

Addresses = dict[str, tuple[int, int]]


class GraphAddressChanged(RuntimeError):
    """A tensor a captured graph reads or writes is no longer where it was at capture."""


def _tensors_of(weight) -> dict[str, torch.Tensor]:
    """The storage a weight form reads: its tensors (packed forms) or its ``storage()`` (wrappers over a view,
    rebuilt when the ring's order changes: the wrapper is new, the memory is not)."""
    if isinstance(weight, torch.Tensor):
        return {"": weight}
    for method in ("tensors", "storage"):
        parts = getattr(weight, method, None)
        if callable(parts):
            return {f".{name}": t for name, t in parts().items()}
    return {}


def graph_addresses(model, kv_caches: list[torch.Tensor], inputs: dict[str, torch.Tensor],
                    slots: list[torch.Tensor]) -> Addresses:
    named: dict[str, torch.Tensor] = dict(inputs)
    named.update({f"kv_cache[{i}]": cache for i, cache in enumerate(kv_caches)})
    named.update({f"staging_slot[{i}]": slot for i, slot in enumerate(slots)})
    named.update({f"param {name}": p for name, p in model.named_parameters()})
    named.update({f"buffer {name}": b for name, b in model.named_buffers()})
    addresses = {name: (t.data_ptr(), t.nbytes) for name, t in named.items()}
    for layer in range(len(model.layers)):
        for ref_name, ref in model.layer_weight_refs(layer).items():
            weight = ref.current
            parts = _tensors_of(weight)
            if not parts:   # a packed CPU form without tensors: its identity stands for its storage
                addresses[f"layer {layer} {ref_name}"] = (id(weight), int(getattr(weight, "nbytes", 0)))
            for suffix, t in parts.items():
                addresses[f"layer {layer} {ref_name}{suffix}"] = (t.data_ptr(), t.nbytes)
    return addresses


def check_addresses(bucket: int, captured: Addresses, now: Addresses) -> None:
    moved = [f"{name}: 0x{captured[name][0]:x} ({captured[name][1]} B) -> "
             + (f"0x{now[name][0]:x} ({now[name][1]} B)" if name in now else "gone")
             for name in captured if now.get(name) != captured[name]]
    moved += [f"{name}: new since capture" for name in now if name not in captured]
    if moved:
        shown = "; ".join(moved[:5]) + (f"; and {len(moved) - 5} more" if len(moved) > 5 else "")
        raise GraphAddressChanged(
            f"the decode graph of batch bucket {bucket} would replay over memory that moved since its capture "
            f"({len(moved)} tensors: {shown}); whatever reallocated them broke DESIGN.md invariant 3 (change "
            f"placements through WeightStore.set_tier, which makes the graphs recapture)")
