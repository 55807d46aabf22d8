"""Block-FP8 checkpoints in DeepSeek's layout (``weight_scale_inv`` per block of 16x16 here, 128x128 in the
published ones): loaded tensor by tensor to exactly the values of their dequantized twin, the fp8 codes kept bit for
bit with each row's block scales for the placement, and what a malformed one is refused with."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from gh200rt.config import EngineConfig, ModelConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.formats.pack import PackedWeight
from gh200rt.loader import ModelLoadError, load_model
from gh200rt.sampling_params import SamplingParams
from tests.model.fp8_block_checkpoint import dequantize_blocks, to_fp8_block_checkpoint
from tests.model.paged_runner import PagedRunner
from tests.model.test_parity_tiny import prompt
from tests.model.tiny_checkpoints import save_tiny


@pytest.fixture(scope="module", params=["deepseek-v3", "qwen3-gqa-untied"])
def block_fp8(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"fp8-blocks-{request.param}")
    path, twin = str(root / "fp8"), str(root / "twin")
    save_tiny(request.param, path)
    names = to_fp8_block_checkpoint(path, (16, 16), twin=twin)
    return request.param, path, twin, names


def test_a_block_fp8_checkpoint_loads_its_dequantized_values(block_fp8):
    family, path, twin, names = block_fp8
    fp8 = load_model(ModelConfig(model=path, dtype="float32"))
    dense = load_model(ModelConfig(model=twin, dtype="float32"))
    assert set(fp8.quantized) == set(names) and all(p.fmt == "fp8" for p in fp8.quantized.values())
    stored = load_file(os.path.join(path, "model.safetensors"))
    for name, packed in fp8.quantized.items():      # the codes as stored, each row with its block row's scales
        assert torch.equal(packed.qweight.view(torch.uint8), stored[name].view(torch.uint8)), name
        scale_inv = stored[name[:-len("weight")] + "weight_scale_inv"]
        assert torch.equal(packed.dequantize(), dequantize_blocks(stored[name], scale_inv, (16, 16))), name
    ids = prompt()
    got = PagedRunner(fp8.model, block_size=4, num_blocks=40).prefill(ids)
    want = PagedRunner(dense.model, block_size=4, num_blocks=40).prefill(ids)
    assert torch.equal(got, want), f"{family}: the block-fp8 model's logits differ from its dequantized twin's"


@pytest.mark.parametrize("options", [
    dict(offload="none"), dict(offload="stream", staging_slots=2, prefetch_distance=1, host_weight_dtype="fp8"),
    dict(offload="none", moe_expert_tier="direct", host_weight_dtype="fp8")])
def test_the_engine_keeps_the_fp8_codes_offloaded_and_gives_the_twins_tokens(block_fp8, options):
    """Offloaded layers (and experts) hold the checkpoint's fp8 codes as their host form (``--host-weight-dtype fp8``;
    a GPU's auto keeps them too); every placement gives the dequantized twin's greedy tokens."""
    family, path, twin, _ = block_fp8
    if "moe_expert_tier" in options and family != "deepseek-v3":
        pytest.skip("a dense model has no experts")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [prompt(1)[:20], prompt(2)[:11]]

    def tokens(model: str, check=None, **placement):
        config = EngineConfig.from_kwargs(model=model, dtype="float32", max_model_len=64, num_kv_blocks=32,
                                          **placement)
        engine = LLMEngine.from_config(config, poison=True)
        try:
            out = [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(prompts, params)]
            if check is not None:
                check(engine)
            return out
        finally:
            engine.close()

    def codes_in_slabs(engine):
        stored, name = load_file(os.path.join(path, "model.safetensors")), "self_attn.o_proj"
        slabs = engine.store.slabs
        assert len(slabs) == engine.runner.model.arch.num_layers
        for i, slab in slabs.items():
            form = slab.layout.forms[name]
            assert isinstance(form, PackedWeight) and form.fmt == "fp8" and form.group_size == 16, form
            in_slab = slab.layout.views(slab.tensor)[name]["qweight"]
            assert torch.equal(in_slab.view(torch.uint8), stored[f"model.layers.{i}.{name}.weight"].view(torch.uint8))
    want = tokens(twin, **{k: v for k, v in options.items() if k != "host_weight_dtype"})
    got = tokens(path, codes_in_slabs if options.get("offload") == "stream" else None, **options)
    assert got == want, (family, options)


def _edited_block_checkpoint(tmp_path, edit) -> str:
    """A tiny DeepSeek-V3 in 16x16 block-FP8, its tensors changed by ``edit(tensors)``."""
    path = str(tmp_path / "m")
    save_tiny("deepseek-v3", path)
    to_fp8_block_checkpoint(path, (16, 16))
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})
    return path


def test_a_scale_block_of_the_wrong_shape_is_named(tmp_path):
    def narrow(tensors):
        name = "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"
        tensors[name] = tensors[name][:, :1].contiguous()
    path = _edited_block_checkpoint(tmp_path, narrow)
    with pytest.raises(ModelLoadError, match=r"kv_b_proj\.weight: a block-fp8 weight \[224, 32\] in blocks of 16x16 "
                                             r"has .* weight_scale_inv of shape \(14, 2\); got .* \(14, 1\)"):
        load_model(ModelConfig(model=path, dtype="float32"))


def test_a_missing_block_scale_is_named(tmp_path):
    path = _edited_block_checkpoint(tmp_path, lambda t: t.pop("model.layers.2.mlp.experts.3.up_proj.weight_scale_inv"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.2\.mlp\.experts\.3\.up_proj\.weight is stored as "
                                             r"float8_e4m3fn in blocks of 16x16 but the checkpoint has no"):
        load_model(ModelConfig(model=path, dtype="float32"))
