"""Our numpy dequantizers against gguf.quants on random blocks of every supported type."""
import numpy as np
import pytest

pytest.importorskip("gguf")  # the reference GGUF reader: a bare GPU host need not have it
from gguf import GGMLQuantizationType, quants  # noqa: E402

from gh200rt.loader.dequant import BF16, F16, Q4_0, Q4_1, Q8_0, dequantize


@pytest.mark.parametrize("ggml_type", [Q4_0, Q4_1, Q8_0])
def test_block_formats_match_gguf_reference(ggml_type):
    rng = np.random.default_rng(ggml_type)
    rows, cols = 7, 96
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    qtype = GGMLQuantizationType(ggml_type)
    raw = quants.quantize(values, qtype)
    expected = quants.dequantize(raw, qtype)
    got = dequantize(raw, ggml_type, (rows, cols))
    assert got.dtype == np.float32 and got.shape == (rows, cols)
    worst = np.abs(got - expected).max()
    assert worst == 0.0, f"type {qtype.name}: worst mismatch {worst}"


def test_float_formats():
    values = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    half = values.astype(np.float16)
    assert np.array_equal(dequantize(half.view(np.uint8), F16, (4, 16)), half.astype(np.float32))
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    expected = (bf16.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(dequantize(bf16.view(np.uint8), BF16, (4, 16)), expected)


def test_unsupported_type_is_named():
    with pytest.raises(ValueError, match="GGML tensor type 12 is not supported"):
        dequantize(np.zeros(144, np.uint8), 12, (1, 256))
