import pytest

from gh200rt.models.arch_config import ArchConfig
from gh200rt.platform.detect import detect
from gh200rt.planner.cost_model import (copy_seconds, layer_compute_seconds, model_sizes,
                                        predict_step_seconds)

TINY = ArchConfig("llama", hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=4, vocab_size=10)


def test_sizes_by_hand():
    sizes = model_sizes(TINY, "bf16")
    # q 8*8 + k,v 2*8*4 + o 8*8 + mlp 3*8*16 + norms 2*8 = 64+64+64+384+16 = 592
    assert sizes.layer_params == 592 and sizes.layer_bytes == 1184
    assert sizes.embed_bytes == (10 * 8 * 2 + 8) * 2
    assert sizes.kv_bytes_per_token == 2 * 4 * 2 * 2  # K+V, 1 kv head x 4, bf16, 2 layers


def test_70b_layer_copy_on_gh200_and_h100_by_hand():
    arch = ArchConfig("llama", hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64,
                      num_kv_heads=8, head_dim=128, vocab_size=128256)
    sizes = model_sizes(arch, "bf16")
    params = 8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert sizes.layer_params == params
    assert copy_seconds(sizes.layer_bytes, detect("gh200-96g")) == pytest.approx(params * 2 / 375e9)
    assert copy_seconds(sizes.layer_bytes, detect("h100-sxm")) == pytest.approx(params * 2 / 52e9)
    # batch 1 decode is memory bound: layer bytes / HBM bandwidth
    assert layer_compute_seconds(sizes, detect("gh200-96g"), 1) == pytest.approx(params * 2 / 3500e9)
    # batch 4096 is compute bound: 2 * params * batch / peak
    assert layer_compute_seconds(sizes, detect("gh200-96g"), 4096) == pytest.approx(2 * params * 4096 / 989e12)


def test_streaming_stall_by_hand():
    plat = detect("h100-sxm")
    sizes = model_sizes(TINY, "bf16")
    c = layer_compute_seconds(sizes, plat, 1)
    x = copy_seconds(sizes.layer_bytes, plat)
    head = sizes.embed_bytes / 2 / (plat.hbm_gbps * 1e9)
    assert predict_step_seconds(["resident"] * 2, sizes, plat, 1) == pytest.approx(2 * c + head)
    # layer 1 streamed, d=1: its copy hides behind layer 0's compute; the rest stalls
    expected = max(2 * c + max(0.0, x - c), x) + head
    assert predict_step_seconds(["resident", "streamed"], sizes, plat, 1) == pytest.approx(expected)
    assert expected > 2 * c + head  # PCIe copy is slower than HBM compute: streaming costs time
