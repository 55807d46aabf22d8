import pytest

from gh200rt.models.arch_config import ArchConfig
from gh200rt.planner.cost_model import (activation_bytes, copy_seconds, host_weight_parts, layer_compute_seconds,
                                        model_sizes, predict_step_seconds)
from gh200rt.platform.detect import detect

TINY = ArchConfig("llama", hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=4, vocab_size=10)


def test_sizes_by_hand():
    sizes = model_sizes(TINY, "bf16")
    # q 8*8 + k,v 2*8*4 + o 8*8 + mlp 3*8*16 + norms 2*8 = 64+64+64+384+16 = 592; linears 576
    assert sizes.layer_params == 592 and sizes.layer_bytes == 576 * 2
    # embed + lm_head 2 * 10*8, final norm 8, 2 layers x 2 norms x 8 in bf16; cos + sin 2048 x 2 in fp32;
    # K and V scales, fp32, per layer
    assert sizes.fixed_bytes == (2 * 10 * 8 + 8 + 2 * 16) * 2 + 2 * 2048 * 2 * 4 + 2 * 2 * 4
    assert sizes.head_bytes == 10 * 8 * 2
    assert sizes.kv_bytes_per_token == 2 * 4 * 2 * 2  # K+V, 1 kv head x 4, bf16, 2 layers
    # the slab: qkv [16, 8], o [8, 8], gate_up [32, 8], down [8, 16] in bf16, each a multiple of 64 bytes
    assert sizes.host_layer_bytes == (16 * 8 + 8 * 8 + 32 * 8 + 8 * 16) * 2 == 1152


def test_fp8_kv_and_fp8_resident_by_hand():
    assert model_sizes(TINY, "bf16", kv_dtype="fp8").kv_bytes_per_token == 2 * 4 * 1 * 2
    assert model_sizes(TINY, "fp32", kv_dtype="fp8_e5m2").kv_bytes_per_token == 2 * 4 * 1 * 2
    assert model_sizes(TINY, "bf16", kv_dtype="auto").kv_bytes_per_token == 2 * 4 * 2 * 2
    # fp8 resident linears: one byte per weight plus a float32 scale per output row (16 + 8 + 32 + 8 rows), each
    # part starting on a 64-byte boundary as in the arena's layout: [128, 64], [64, 32], [256, 128], [128, 32]
    assert model_sizes(TINY, "bf16", resident_format="fp8").layer_bytes == 128 + 64 + 64 + 64 + 256 + 128 + 128 + 32


def test_host_formats_by_hand():
    assert host_weight_parts("int8", (10, 100)) == [1000, 40]               # int8 codes + fp32 scale per row
    assert host_weight_parts("int4", (10, 100)) == [500, 4 * 10 * 4, 160]   # nibbles; 4 groups of 32: scale, min
    assert host_weight_parts("fp16", (3, 5)) == [30]
    assert host_weight_parts("fp8", (10, 100)) == [1000, 40]                # e4m3 codes + fp32 scale per row
    # TINY in int8: parts [128, 64], [64, 32], [256, 128], [128, 32], each padded to 64 bytes
    assert model_sizes(TINY, "bf16", host_format="int8").host_layer_bytes == 128 + 64 + 64 + 64 + 256 + 128 + 128 + 32
    with pytest.raises(ValueError, match="int8"):
        host_weight_parts("int3", (1, 1))


def test_activation_bytes_by_hand():
    # per token: (3 * 8 hidden + 8 q + 2 * 4 kv + 3 * 16 intermediate) * 2 bytes; logits: 4 rows x 10 x fp32
    assert activation_bytes(TINY, 16, 4, "bf16") == 16 * (24 + 8 + 8 + 48) * 2 + 4 * 10 * 4


def test_70b_layer_copy_on_gh200_and_h100_by_hand():
    arch = ArchConfig("llama", hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
                      num_kv_heads=8, head_dim=128, vocab_size=128256)
    sizes = model_sizes(arch, "bf16")
    params = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert sizes.layer_params == params and sizes.layer_bytes == (params - 2 * 8192) * 2
    assert copy_seconds(sizes.layer_bytes, detect("gh200-96g")) == pytest.approx((params - 2 * 8192) * 2 / 375e9)
    assert copy_seconds(sizes.layer_bytes, detect("h100-sxm")) == pytest.approx((params - 2 * 8192) * 2 / 55.2e9)
    # batch 1 decode is memory bound: layer bytes / HBM bandwidth
    layer = sizes.layers[0]
    assert layer_compute_seconds(layer, detect("gh200-96g"), 1) == pytest.approx((params - 2 * 8192) * 2 / 3500e9)
    # batch 4096 is compute bound: 2 * params * batch / peak
    assert layer_compute_seconds(layer, detect("gh200-96g"), 4096) == pytest.approx(2 * params * 4096 / 989e12)


def test_streaming_stall_by_hand():
    plat = detect("h100-sxm")
    sizes = model_sizes(TINY, "bf16")
    c = layer_compute_seconds(sizes.layers[0], plat, 1)
    x = copy_seconds(sizes.host_layer_bytes, plat)
    head = sizes.head_bytes / (plat.hbm_gbps * 1e9)
    assert predict_step_seconds(["resident"] * 2, sizes, plat, 1) == pytest.approx(2 * c + head)
    # layer 1 streamed, d=1: its copy hides behind layer 0's compute; the rest stalls
    expected = max(2 * c + max(0.0, x - c), x) + head
    assert predict_step_seconds(["resident", "streamed"], sizes, plat, 1) == pytest.approx(expected)
    assert expected > 2 * c + head  # PCIe copy is slower than HBM compute: streaming costs time
