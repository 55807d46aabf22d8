"""FP8 checkpoints in the Hugging Face layout (a tiny one generated here): the CPU computes with the
dequantized weights exactly, offloaded layers keep the checkpoint's fp8 bytes, checkpoint KV scales
reach the attention layers, and layouts gh200rt does not read are refused by name."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from gh200rt.config import EngineConfig, ModelConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.formats.pack import PackedWeight
from gh200rt.loader import ModelLoadError, load_model
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama
from tests.model.tiny_checkpoints import to_fp8_checkpoint

PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(fp8 checkpoint, the same model with the dequantized weights stored densely, dequantized tensors)."""
    root = tmp_path_factory.mktemp("fp8-ckpt")
    fp8_dir, dense_dir = str(root / "fp8"), str(root / "dense")
    save_tiny_llama(fp8_dir, num_layers=3)
    shutil.copytree(fp8_dir, dense_dir)
    dequantized = to_fp8_checkpoint(fp8_dir, "fp8", kv_scales={1: (0.02, 0.03)})
    dense = load_file(os.path.join(dense_dir, "model.safetensors"))
    save_file({**dense, **dequantized}, os.path.join(dense_dir, "model.safetensors"), metadata={"format": "pt"})
    return fp8_dir, dense_dir, dequantized


def generate(model: str, **options):
    config = EngineConfig.from_kwargs(model=model, dtype="float32", max_model_len=128, **options)
    engine = LLMEngine.from_config(config, poison=True)
    outs = LLM.from_engine(engine).generate(PROMPTS, PARAMS)
    return engine, [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs]) for o in outs]


def test_cpu_computes_with_the_dequantized_weights(checkpoints):
    fp8_dir, dense_dir, _ = checkpoints
    fp8 = load_model(ModelConfig(model=fp8_dir, dtype="float32"))
    dense = load_model(ModelConfig(model=dense_dir, dtype="float32"))
    for i in range(3):
        for name, ref in fp8.model.layer_weight_refs(i).items():
            assert torch.equal(ref.current, dense.model.layer_weight_refs(i)[name].current), name
    assert len(fp8.quantized) == 3 * 7 and all(p.fmt == "fp8" for p in fp8.quantized.values())
    _, got = generate(fp8_dir, offload="none")
    _, want = generate(dense_dir, offload="none")
    assert got == want


def test_checkpoint_kv_scales_reach_the_layers(checkpoints):
    loaded = load_model(ModelConfig(model=checkpoints[0], dtype="float32"))
    scales = [m.kv_scale for m in loaded.model.modules() if isinstance(m, SelfAttention)]
    assert torch.equal(scales[0], torch.ones(2)) and torch.allclose(scales[1], torch.tensor([0.02, 0.03]))


@pytest.mark.parametrize("tiers", [dict(offload="direct"), dict(offload="stream", staging_slots=2, prefetch_distance=1)],
                         ids=["direct", "stream"])
def test_offloaded_layers_keep_the_checkpoint_fp8_bytes(checkpoints, tiers):
    fp8_dir, dense_dir, _ = checkpoints
    engine, got = generate(fp8_dir, host_weight_dtype="fp8", **tiers)
    stored = load_file(os.path.join(fp8_dir, "model.safetensors"))
    for i in range(3):
        slab = engine.store.slabs[i]
        form = slab.layout.forms["self_attn.qkv_proj"]
        assert isinstance(form, PackedWeight) and form.fmt == "fp8"
        in_slab = slab.layout.views(slab.tensor)["self_attn.qkv_proj"]["qweight"]
        want = torch.cat([stored[f"model.layers.{i}.self_attn.{p}_proj.weight"] for p in "qkv"])
        assert torch.equal(in_slab.view(torch.uint8), want.view(torch.uint8))  # lossless: the same bytes
    _, want = generate(dense_dir, offload="none")
    assert got == want  # fp8 bytes x scale, multiplied in float32: what the dequantized model computes
    engine.close()


def test_compressed_tensors_layout_loads(tmp_path):
    path = str(tmp_path / "ct")
    save_tiny_llama(path)
    dequantized = to_fp8_checkpoint(path, "compressed-tensors")
    loaded = load_model(ModelConfig(model=path, dtype="float32"))
    down = loaded.model.layer_weight_refs(1)["mlp.down_proj"].current
    assert torch.equal(down, dequantized["model.layers.1.mlp.down_proj.weight"])


def _edit(path: str, config_change=None, drop: str | None = None, add_fp8: str | None = None) -> None:
    if config_change is not None:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        config_change(config)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    if drop or add_fp8:
        file = os.path.join(path, "model.safetensors")
        tensors = load_file(file)
        tensors.pop(drop, None)
        if add_fp8:
            tensors[add_fp8] = tensors[add_fp8].to(torch.float8_e4m3fn)
        save_file(tensors, file, metadata={"format": "pt"})


BAD = {
    "block size without block scales": (lambda c: c["quantization_config"].update(weight_block_size=[128, 128]),
                                        None, "in blocks of 128x128 but the checkpoint has no .*weight_scale_inv"),
    "a malformed block size": (lambda c: c["quantization_config"].update(weight_block_size=[128]), None,
                               r"weight_block_size \[128\] is not two positive integers"),
    "4-bit compressed-tensors": (lambda c: c.update(quantization_config={
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}), None,
        "4-bit int with strategy 'group'"),
    "another method": (lambda c: c.update(quantization_config={"quant_method": "awq"}), None,
                       "quant_method 'awq' is not supported"),
    "missing scale": (None, "model.layers.0.mlp.up_proj.weight_scale", "has no model.layers.0.mlp.up_proj.weight_scale"),
    "fp8 without a config": (lambda c: c.pop("quantization_config"), None, "no quantization_config"),
}


@pytest.mark.parametrize("case", BAD)
def test_unsupported_fp8_layouts_are_refused_by_name(tmp_path, case):
    path = str(tmp_path / "bad")
    save_tiny_llama(path)
    to_fp8_checkpoint(path, "fp8")
    change, drop, message = BAD[case]
    _edit(path, change, drop)
    with pytest.raises(ModelLoadError, match=message):
        load_model(ModelConfig(model=path, dtype="float32"))
