"""``AmxWeight``: a resident bf16 linear in the tile layout of the native AMX kernel (``kernels/cpu/amx_linear.c``);
``Bf16DotWeight``: the same layout multiplied by AVX-512 BF16 dot products on CPUs without AMX
(``kernels/cpu/bf16_dot_linear.c``, the ``dot-bf16`` form).

The bf16 route's form on CPUs with AMX (``amx-bf16``, chosen by ``prepack.resident_linear_format``). Its rows'
bits do not depend on the call's row count, so a step that computes prompt positions multiplies all its rows in
one call (``RefLinear`` asks ``invariant_form``) instead of the probed row blocks oneDNN needs
(``row_blocks.py``); at SmolLM2-135M's prompt shapes it runs as fast as oneDNN's unblocked GEMM
(docs/BENCHMARKS.md).
"""
from __future__ import annotations

import torch

AMX_K_MULTIPLE = 32  # the kernel reads activations in place, 32 bf16 columns per tile row


def amx_fits(weight: torch.Tensor) -> bool:
    """Whether ``weight`` can take the AMX form: bf16 ``[N, K]`` on the CPU with K a multiple of 32."""
    return (weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.device.type == "cpu"
            and weight.shape[1] % AMX_K_MULTIPLE == 0 and weight.shape[0] > 0)


def gated_rows(weight: torch.Tensor) -> int:
    """The ``inter`` a gated MLP's ``[gate | up]`` weight can be packed gated with (``AmxWeight``'s fused SiLU), or 0
    where its halves are not multiples of 16 rows."""
    half = weight.shape[0] // 2
    return half if weight.shape[0] == 2 * half and half % 16 == 0 else 0


class AmxWeight:
    """A bf16 ``[N, K]`` weight packed for ``NativeOps.amx_linear`` (satisfies the ``WeightRef`` contract).
    ``gated_inter``: a gated MLP's ``[gate | up]`` weight packed so that ``silu_linear`` returns ``silu(gate) * up``
    in one call, with the bits of ``linear`` followed by the native ``silu_mul``."""
    __slots__ = ("packed", "ops", "shape", "dtype", "nbytes", "gated_inter")

    def __init__(self, weight: torch.Tensor, ops, gated_inter: int = 0):
        assert amx_fits(weight) and self.runs_on(ops), (weight.dtype, tuple(weight.shape))
        self.packed, self.ops, self.gated_inter = ops.amx_pack(weight, gated_inter), ops, gated_inter
        self.shape, self.dtype = tuple(weight.shape), weight.dtype
        self.nbytes = weight.nbytes  # the packed copy holds the same values (plus padding to 32 columns)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        self._check(x)
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
            bias = bias.float().contiguous()
        n, k = self.shape
        return self._kernel()(x, self.packed, n, k, bias, self.gated_inter)

    def silu_linear(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of the product (a gated weight, no bias)."""
        self._check(x)
        n, k = self.shape
        return self._kernel()(x, self.packed, n, k, None, self.gated_inter, silu=True)

    def _kernel(self):
        return self.ops.amx_linear

    def invariant_form(self) -> "AmxWeight":
        """The form that computes every row alike at any row count: this one."""
        return self

    def silu_form(self, rows: int, block_rows: int | None) -> "AmxWeight | None":
        """The form whose ``silu_linear`` gives this weight's product followed by ``silu_mul`` for a call of
        ``rows`` rows (``block_rows``: RefLinear's): this one where it is packed gated."""
        return self if self.gated_inter else None

    @staticmethod
    def runs_on(ops) -> bool:
        return ops.amx_available()

    @staticmethod
    def _check(x: torch.Tensor) -> None:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"this AmxWeight multiplies bfloat16 activations, got {x.dtype}")

    def __repr__(self) -> str:
        return f"AmxWeight(shape={self.shape})"


class Bf16DotWeight(AmxWeight):
    """``AmxWeight``'s packed layout and contract, multiplied by AVX-512 BF16 dot products (``NativeOps.bf16_dot_linear``):
    the ``dot-bf16`` form of CPUs with AVX-512 BF16 and no AMX. Its rows' bits are its own, alike at every row count."""
    __slots__ = ()

    @staticmethod
    def runs_on(ops) -> bool:
        return ops.bf16_dot_available()

    def _kernel(self):
        return self.ops.bf16_dot_linear

    def __repr__(self) -> str:
        return f"Bf16DotWeight(shape={self.shape})"
