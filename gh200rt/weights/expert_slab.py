"""One MoE layer's routed experts in their host forms, expert after expert in one slab.

Every expert has the same linears of the same shapes, so with each part starting on a 64-byte boundary the
layout is periodic: expert e's bytes are the contiguous span ``[e * stride, e * stride + expert_nbytes)``,
and each projection's stack sits at one stride (what a grouped kernel reads). One expert's weights can then
be rebuilt over any buffer holding its span: the slab itself read in place (a DIRECT expert), a staging slot
(a STREAMED expert, copied only in the steps that route to it) or a device copy (a RESIDENT expert, with
exactly the bits it has when it streams).
"""
from __future__ import annotations

import torch

from gh200rt.weights.layer_slab import LayerSlab, WeightLayout, meta_form


class ExpertSlab:
    def __init__(self, expert_forms: list[dict[str, object]], node: int, platform, device: torch.device,
                 slab: LayerSlab | None = None):
        """``expert_forms[e]``: expert e's linears (name -> host form), the same names and shapes for every e;
        ``slab``: their bytes already laid out by ``flat(expert_forms)`` (read back from the slab cache)."""
        names = list(expert_forms[0])
        self.expert_layout = WeightLayout({name: meta_form(form) for name, form in expert_forms[0].items()})
        self._names = names
        self.slab = slab if slab is not None else LayerSlab(self.flat(expert_forms), node, platform, device)
        starts: dict[str, int] = {}
        for name, _, _, _, offset in self.slab.layout.parts:
            starts.setdefault(name, offset)
        self.stride = starts[f"1/{names[0]}"] - starts[f"0/{names[0]}"] if len(expert_forms) > 1 \
            else self.expert_layout.nbytes
        for name, part, shape, dtype, offset in self.slab.layout.parts:
            e, _, local = name.partition("/")
            want = int(e) * self.stride + self._local_offset(local, part)
            assert offset == want, f"expert slab layout is not periodic at {name}.{part}: {offset} != {want}"
        self.num_experts = len(expert_forms)
        self._direct: list[dict[str, object]] | None = None
        self._host: dict[int, dict[str, object]] = {}

    @staticmethod
    def flat(expert_forms: list[dict[str, object]]) -> dict[str, object]:
        """Every expert's linears in slab order, keyed ``E/name``."""
        return {f"{e}/{name}": form for e, forms in enumerate(expert_forms) for name, form in forms.items()}

    def _local_offset(self, name: str, part: str) -> int:
        for local, local_part, *_, offset in self.expert_layout.parts:
            if (local, local_part) == (name, part):
                return offset
        raise KeyError((name, part))

    @property
    def nbytes(self) -> int:
        return self.slab.nbytes

    @property
    def expert_nbytes(self) -> int:
        """One expert's span: a staging slot or a resident copy holds this many bytes."""
        return self.expert_layout.nbytes

    def source(self, expert: int) -> torch.Tensor:
        """Expert ``expert``'s bytes on the host: what a staging copy or a promotion reads."""
        start = expert * self.stride
        return self.slab.tensor[start:start + self.expert_nbytes]

    def bind(self, buffer: torch.Tensor, compute_dtype: torch.dtype, stable: bool) -> dict[str, object]:
        """One expert's weights over ``buffer`` (its span's bytes), keyed by the expert's linear names."""
        return self.expert_layout.bind(buffer, compute_dtype, stable)

    def direct(self, expert: int, compute_dtype: torch.dtype) -> dict[str, object]:
        """Expert ``expert``'s weights read in place (built once for the whole slab and kept)."""
        if self._direct is None:
            every = self.slab.direct(compute_dtype)
            self._direct = [{name: every[f"{e}/{name}"] for name in self._names} for e in range(self.num_experts)]
        return self._direct[expert]

    def host(self, expert: int, compute_dtype: torch.dtype) -> dict[str, object]:
        """Expert ``expert``'s weights as the host's cores read them (a cpu-tier expert): on the CPU platform its
        direct weights, on a GPU host its forms over the slab's host bytes (built once and kept)."""
        if self.slab.device.type == "cpu":
            return self.direct(expert, compute_dtype)
        if expert not in self._host:
            self._host[expert] = self.bind(self.source(expert), compute_dtype, stable=True)
        return self._host[expert]

    def device_copy(self, expert: int, device: torch.device) -> torch.Tensor:
        """A device buffer holding expert ``expert``'s span: its resident home."""
        copy = torch.empty(self.expert_nbytes, dtype=torch.uint8, device=device)
        copy.copy_(self.source(expert))
        return copy

    def free(self) -> None:
        self._direct = None
        self._host.clear()
        self.slab.free()
