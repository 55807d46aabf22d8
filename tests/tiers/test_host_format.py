"""``--host-weight-dtype``: ``auto`` never rounds a dense checkpoint (on a GPU it used to store an fp32 model's
offloaded layers as bf16, so a layer promoted back to HBM no longer held the checkpoint's weights), and
``fp32`` is a format of its own."""
import re

import pytest
import torch

from gh200rt.config import EngineConfig, MemoryConfig
from gh200rt.formats.pack import pack_weight
from gh200rt.plan import main as plan_main
from gh200rt.weights.forms import GGUF, resolve_host_format
from gh200rt.weights.tiers import Tier
from tests.tiers.test_engine_placement import engine, run


@pytest.mark.parametrize("dtype,name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")])
@pytest.mark.parametrize("on_cpu", [True, False], ids=["cpu", "gpu"])
def test_auto_follows_the_model_dtype_on_every_device(dtype, name, on_cpu):
    assert resolve_host_format("auto", on_cpu, dtype, has_quantized=False) == name
    assert resolve_host_format("int4", on_cpu, dtype, has_quantized=False) == "int4"
    assert resolve_host_format("auto", False, dtype, has_quantized=True) == GGUF


def test_fp32_is_a_host_format():
    weight = torch.randn(6, 8, dtype=torch.bfloat16)
    packed = pack_weight(weight, "fp32")
    assert packed.dtype == torch.float32 and torch.equal(packed, weight.float())
    assert MemoryConfig(host_weight_dtype="fp32").host_weight_dtype == "fp32"
    with pytest.raises(ValueError, match="choose one of auto, fp32, bf16"):
        MemoryConfig(host_weight_dtype="fp64")
    assert EngineConfig.from_kwargs(host_weight_dtype="fp32").memory.host_weight_dtype == "fp32"


def _host_gib(capsys, *args) -> float:
    assert plan_main(["--model", "tests/fixtures/llama31_70b", "--platform", "h100-sxm", "--offload", "stream",
                      *args]) == 0
    return float(re.search(r"host memory for offloaded weights: +([\d.]+) GiB", capsys.readouterr().out).group(1))


def test_the_plan_cli_books_an_fp32_models_host_weights_at_fp32_on_a_gpu(capsys):
    fp32, bf16 = _host_gib(capsys, "--dtype", "fp32"), _host_gib(capsys, "--dtype", "bf16")
    assert fp32 == pytest.approx(2 * bf16, rel=0.01)
    assert _host_gib(capsys, "--dtype", "fp32", "--host-weight-dtype", "bf16") == pytest.approx(bf16, rel=0.01)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from tests.engine.real_models import save_tiny_llama
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny4-host-format")), num_layers=4)


@pytest.mark.parametrize("host,exact", [("fp32", True), ("bf16", False)])
def test_a_layer_demoted_and_promoted_again_holds_the_checkpoints_weights_only_in_fp32(tiny_dir, host, exact):
    reference = run(engine(tiny_dir, offload="none"))
    eng = engine(tiny_dir, offload="dynamic", host_weight_dtype=host)
    for tier in (Tier.STREAMED, Tier.RESIDENT):
        for layer in range(4):
            eng.store.set_tier(layer, tier)
    assert eng.store.tiers == [Tier.RESIDENT] * 4
    assert (run(eng) == reference) == exact
    eng.close()
