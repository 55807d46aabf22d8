"""GGUF MoE files as llama.cpp writes them (``qwen3moe``, ``qwen2moe`` with a shared expert, ``llama`` with experts
for Mixtral), written with the ``gguf`` package from a tiny safetensors checkpoint (tests/model/tiny_gguf.py):
float32 tokens and logits equal the safetensors directory's, a Q8_0 file equals its dequantized twin bit for bit
with each expert's blocks kept as stored, and a missing, unexpected or mis-shaped tensor is named."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gh200rt.loader import ModelLoadError
from gh200rt.loader.dequant import dequantize
from gh200rt.weights.device_moves import gguf_parts
from tests.model.paged_runner import PagedRunner
from tests.model.test_parity_tiny import prompt
from tests.model.tiny_checkpoints import save_tiny
from tests.model.tiny_gguf import (assert_decodes_alike, assert_equals_dequantized_twin, gguf_tensors, load_f32,
                                   write_gguf)

STEPS = 8
# tiny families whose every layer is sparse (a GGUF MoE file has no dense-layer list); Qwen3-MoE renormalises and
# Qwen2-MoE does not, as llama.cpp's graphs for qwen3moe / qwen2moe do
GGUF_FAMILIES = {"qwen3-moe-norm": {}, "qwen2-moe-shared": {"mlp_only_layers": []}, "mixtral": {}}
ARCHITECTURES = {"qwen3-moe-norm": "qwen3_moe", "qwen2-moe-shared": "qwen2_moe", "mixtral": "mixtral"}


@pytest.fixture(scope="module", params=sorted(GGUF_FAMILIES))
def checkpoint(request, tmp_path_factory):
    """(family, safetensors directory, its GGUF files by type)."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    directory = str(root / "hf")
    save_tiny(family, directory, **GGUF_FAMILIES[family])
    files = {}
    for qtype in ("F32", "Q8_0"):
        files[qtype] = str(root / f"model.{qtype}.gguf")
        write_gguf(directory, files[qtype], qtype)
    return family, directory, files



def test_f32_gguf_decodes_as_the_safetensors_directory(checkpoint):
    family, directory, files = checkpoint
    ours, reference = load_f32(files["F32"]), load_f32(directory)
    # GGUF stores rms_norm_eps as a float32
    assert ours.arch == dataclasses.replace(reference.arch, rms_norm_eps=ours.arch.rms_norm_eps,
                                            checkpoint_dtype="gguf")
    assert ours.arch.architecture == ARCHITECTURES[family]
    assert not ours.quantized
    assert_decodes_alike(ours, reference, STEPS, f"{family} F32")


def test_q8_0_gguf_equals_its_dequantized_twin_and_keeps_expert_blocks(checkpoint, tmp_path):
    family, directory, files = checkpoint
    ours = assert_equals_dequantized_twin(directory, files["Q8_0"], str(tmp_path / "twin"), "Q8_0", STEPS,
                                          f"{family} Q8_0")
    # against the unquantized weights: Q8_0 rounding moves a tiny random model's logits by a few percent, and flips
    # the router's choice for some tokens (its probabilities sit close together), which moves those further
    prefill = PagedRunner(ours.model, block_size=4, num_blocks=40).prefill(prompt())
    reference = PagedRunner(load_f32(directory).model, block_size=4, num_blocks=40).prefill(prompt())
    per_position = (prefill - reference).abs().amax(dim=-1) / reference.abs().max()
    print(f"{family}: Q8_0 vs float32 weights: per-position relative error median {per_position.median():.3g}, "
          f"worst {per_position.max():.3g}")
    assert float(per_position.median()) <= 0.1

    layer = ours.model.layers[1].mlp
    block = "block_sparse_moe" if family == "mixtral" else "mlp"
    names = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    for e in (0, layer.num_experts - 1):
        parts = [ours.quantized[f"model.layers.1.{block}.experts.{e}.{n}.weight"] for n in names]
        assert all(p.type_name == "Q8_0" and p.data.dtype == np.uint8 for p in parts)
        gate_up = np.concatenate([dequantize(p.data, p.ggml_type, p.shape) for p in parts[:2]])
        down = dequantize(parts[2].data, parts[2].ggml_type, parts[2].shape)
        expert = layer.experts[e]
        assert torch.equal(expert.gate_up_proj.weight_ref.current, torch.from_numpy(gate_up))
        assert torch.equal(expert.down_proj.weight_ref.current, torch.from_numpy(down))
    assert f"model.layers.1.{block}.gate.weight" not in ours.quantized   # the router stays F32, as llama.cpp keeps it
    # the weight store finds every expert's blocks under the model's names (host forms, CPU route forms)
    for e in range(layer.num_experts):
        gate_up = gguf_parts(ours.quantized, 1, f"mlp.experts.{e}.gate_up_proj")
        down = gguf_parts(ours.quantized, 1, f"mlp.experts.{e}.down_proj")
        assert gate_up is not None and down is not None, (family, e)
        assert [p.shape for p in gate_up] == [ours.quantized[f"model.layers.1.{block}.experts.{e}.{n}.weight"].shape
                                            for n in names[:2]]


# ---- strict loading ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("qwen2moe") / "hf")
    save_tiny("qwen2-moe-shared", directory, mlp_only_layers=[])
    return directory


def _edited(directory: str, tmp_path, edit) -> str:
    tensors = gguf_tensors(directory)
    edit(tensors)
    path = str(tmp_path / "edited.gguf")
    write_gguf(directory, path, "F32", tensors)
    return path


def test_missing_expert_stack_and_shared_expert_are_named(qwen2_moe, tmp_path):
    def drop(t):
        del t["blk.2.ffn_up_exps.weight"]
        del t["blk.0.ffn_gate_inp_shexp.weight"]
    with pytest.raises(ModelLoadError, match=r"missing weights: model\.layers\.0\.mlp\.shared_expert_gate\.weight, "
                                             r"blk\.2\.ffn_up_exps\.weight; partly merged.*"
                                             r"model\.layers\.2\.mlp\.experts\.0\.gate_up_proj"):
        load_f32(_edited(qwen2_moe, tmp_path, drop))


def test_unexpected_expert_stack_is_named(qwen2_moe, tmp_path):
    def add(t):
        t["blk.4.ffn_down_exps.weight"] = t["blk.0.ffn_down_exps.weight"]
        t["blk.1.ffn_gate_exps_extra.weight"] = t["blk.0.ffn_gate_exps.weight"]
    with pytest.raises(ModelLoadError, match=r"unexpected weights the model does not use: blk\.4\.ffn_down_exps\.weight, "
                                             r"blk\.1\.ffn_gate_exps_extra\.weight"):
        load_f32(_edited(qwen2_moe, tmp_path, add))


def test_mis_shaped_expert_stack_is_named(qwen2_moe, tmp_path):
    def fewer_experts(t):
        t["blk.3.ffn_gate_exps.weight"] = t["blk.3.ffn_gate_exps.weight"][:6]
    with pytest.raises(ModelLoadError, match=r"blk\.3\.ffn_gate_exps\.weight has shape \(6, 32, 64\) \(experts, rows, "
                                             r"columns\) but the model config needs \(8, 32, 64\)"):
        load_f32(_edited(qwen2_moe, tmp_path, fewer_experts))


def test_a_quantized_gguf_moe_engine_gives_the_same_tokens_in_every_expert_tier(checkpoint):
    """The engine over a Q8_0 file (float32): every expert tier generates the same tokens, the cpu tier's pool
    included (on the CPU an expert slab holds the dequantized weights, as a dense layer's slab does; a GPU's keeps the
    blocks)."""
    from tests.tiers.test_engine_placement import engine, run
    family, _, files = checkpoint
    outputs = {}
    for tier in ("resident", "direct", "stream", "cpu"):
        eng = engine(files["Q8_0"], offload="none", moe_expert_tier=tier, max_model_len=64)
        outputs[tier] = run(eng, prompts=[prompt()[:12]])
        if tier != "resident":
            assert len(eng.store.expert_slabs) == eng.runner.model.arch.num_layers
        eng.close()
    assert outputs["direct"] == outputs["resident"] == outputs["stream"] == outputs["cpu"], family
