"""Random fp8 weights for the native fp8 linear's tests."""
import torch

from gh200rt.formats.packed_weight import PackedWeight


def fp8_weight(n: int, k: int, group: int, seed: int):
    """A PackedWeight of random e4m3fn codes (every finite code likely, NaN never) with scales per ``group``
    columns (>= k: one per channel)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.uint8)
    codes[(codes & 0x7f) == 0x7f] ^= 1
    scale = torch.rand(n, -(-k // group), generator=gen) * 0.01 + 1e-4
    return PackedWeight("fp8", codes.view(torch.float8_e4m3fn), scale, None, min(group, k), (n, k))
