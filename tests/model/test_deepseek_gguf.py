"""GGUF ``deepseek2`` files as llama.cpp writes them (DeepSeek-V3 / R1, Kimi-K2, DeepSeek-V2), written with the ``gguf``
package from a tiny safetensors checkpoint (tests/model/tiny_gguf.py): both layouts of the latent attention's kv_b
(split into attn_k_b / attn_v_b as llama.cpp writes it now, whole as before) decode in float32 as the safetensors
directory does, bit for bit; a Q8_0 file equals its dequantized twin with each expert's blocks kept as stored and
serves through the engine; multi-token-prediction blocks are skipped; a missing half of kv_b is named."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from gh200rt.config import EngineConfig, ModelConfig
from gh200rt.distributed.sharding import TensorShard
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.loader import ModelLoadError, load_model
from gh200rt.loader.load import read_arch
from gh200rt.models.arch_config import ArchConfig
from gh200rt.sampling_params import SamplingParams
from tests.model.test_parity_tiny import prompt
from tests.model.tiny_checkpoints import YARN_ROPE, save_tiny
from tests.model.tiny_gguf import (assert_decodes_alike, assert_equals_dequantized_twin, gguf_tensors, load_f32,
                                   write_gguf)

STEPS = 6
# llama.cpp keeps one YaRN figure (yarn_log_multiplier = 0.1 x mscale_all_dim) and computes mscale = mscale_all_dim,
# as DeepSeek's published configs have it: the tiny V3 is made so
FAMILIES = {"deepseek-v3": dict(rope_parameters={**YARN_ROPE, "mscale": YARN_ROPE["mscale_all_dim"]}),
            "deepseek-v2-lite": {}}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, tmp_path_factory):
    """(family, safetensors directory, its float32 GGUF files split and whole, its split Q8_0 file)."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    directory = str(root / "hf")
    save_tiny(family, directory, **FAMILIES[family])
    files = {}
    for label, qtype, split in (("F32", "F32", True), ("F32 whole kv_b", "F32", False), ("Q8_0", "Q8_0", True)):
        files[label] = str(root / f"{label.replace(' ', '-')}.gguf")
        write_gguf(directory, files[label], qtype, split=split)
    return family, directory, files



@pytest.mark.parametrize("layout", ["F32", "F32 whole kv_b"])
def test_f32_gguf_decodes_as_the_safetensors_directory(checkpoint, layout):
    family, directory, files = checkpoint
    ours, reference = load_f32(files[layout]), load_f32(directory)
    # GGUF stores rms_norm_eps as a float32 and carries no MTP block here (llama.cpp's converter drops it)
    assert ours.arch == dataclasses.replace(reference.arch, rms_norm_eps=ours.arch.rms_norm_eps,
                                            checkpoint_dtype="gguf", num_nextn_predict_layers=0)
    assert ours.arch.architecture == reference.arch.architecture
    assert ours.arch.is_mla and ours.arch.moe_layers == reference.arch.moe_layers
    assert_decodes_alike(ours, reference, STEPS, f"{family} {layout}")


def test_q8_0_gguf_equals_its_dequantized_twin_and_keeps_expert_blocks(checkpoint, tmp_path):
    family, directory, files = checkpoint
    ours = assert_equals_dequantized_twin(directory, files["Q8_0"], str(tmp_path / "twin"), "Q8_0", STEPS,
                                          f"{family} Q8_0")
    experts = [name for name in ours.quantized if ".experts." in name]
    assert len(experts) == 3 * 8 * len(ours.arch.moe_layers)      # gate, up, down of every routed expert
    assert not any("kv_b_proj" in name for name in ours.quantized)  # joined from its halves: dense


def test_a_q8_0_file_serves_with_experts_in_every_tier(checkpoint, tmp_path):
    """Through the engine: the experts' GGUF blocks read in place or streamed give the tokens they give resident."""
    _, _, files = checkpoint
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = {}
    for tier in ("resident", "direct", "stream"):
        config = EngineConfig.from_kwargs(model=files["Q8_0"], dtype="float32", max_model_len=64, offload="none",
                                          moe_expert_tier=tier)
        engine = LLMEngine.from_config(config, poison=True)
        try:
            runs[tier] = [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate([prompt()[:12]], params)]
        finally:
            engine.close()
    assert runs["direct"] == runs["resident"] == runs["stream"], runs


@pytest.mark.parametrize("checkpoint", ["deepseek-v3"], indirect=True)
def test_mtp_blocks_are_skipped_and_a_missing_half_of_kv_b_is_named(checkpoint, tmp_path):
    _, directory, _ = checkpoint
    tensors = gguf_tensors(directory)
    # an MTP block as the file carries it: one more block past block_count - nextn_predict_layers
    with_mtp = {**tensors, "blk.3.nextn.eh_proj.weight": np.zeros((64, 128), np.float32),
                "blk.3.attn_norm.weight": np.ones(64, np.float32),
                "blk.3.ffn_gate_exps.weight": tensors["blk.1.ffn_gate_exps.weight"]}
    path = str(tmp_path / "mtp.gguf")
    write_gguf(directory, path, tensors=with_mtp, nextn_blocks=1)
    ours = load_f32(path)
    assert ours.arch.num_layers == 3 and ours.arch.num_nextn_predict_layers == 1
    assert_decodes_alike(ours, load_f32(directory), STEPS, "with an MTP block")
    without_v = {name: value for name, value in tensors.items() if name != "blk.2.attn_v_b.weight"}
    path = str(tmp_path / "no-v.gguf")
    write_gguf(directory, path, tensors=without_v)
    with pytest.raises(ModelLoadError, match=r"blk\.2\.attn_k_b\.weight is here but blk\.2\.attn_v_b\.weight is not"):
        load_f32(path)
    neither = {name: value for name, value in tensors.items() if not name.startswith(("blk.2.attn_k_b",
                                                                                      "blk.2.attn_v_b"))}
    path = str(tmp_path / "no-kv-b.gguf")
    write_gguf(directory, path, tensors=neither)
    with pytest.raises(ModelLoadError, match=r"blk\.2\.attn_kv_b\.weight \(or blk\.2\.attn_k_b\.weight and "
                                             r"blk\.2\.attn_v_b\.weight\)"):
        load_f32(path)


def test_metadata_maps_onto_deepseeks_config_fields():
    """A file's router decides the family (sigmoid: V3, softmax: V2), its groups the group limit; a YaRN file's
    attention scale comes from yarn_log_multiplier."""
    base = {"general.architecture": "deepseek2", "deepseek2.block_count": 61, "deepseek2.embedding_length": 7168,
            "deepseek2.feed_forward_length": 18432, "deepseek2.attention.head_count": 128,
            "deepseek2.attention.head_count_kv": 1, "deepseek2.attention.key_length": 576,
            "deepseek2.attention.value_length": 512, "deepseek2.attention.key_length_mla": 192,
            "deepseek2.attention.value_length_mla": 128, "deepseek2.attention.q_lora_rank": 1536,
            "deepseek2.attention.kv_lora_rank": 512, "deepseek2.rope.dimension_count": 64,
            "deepseek2.leading_dense_block_count": 3, "deepseek2.expert_count": 256,
            "deepseek2.expert_used_count": 8, "deepseek2.expert_feed_forward_length": 2048,
            "deepseek2.expert_shared_count": 1, "deepseek2.expert_weights_scale": 2.5,
            "deepseek2.expert_weights_norm": True, "deepseek2.expert_gating_func": 2,
            "deepseek2.expert_group_count": 8, "deepseek2.expert_group_used_count": 4,
            "deepseek2.rope.scaling.type": "yarn", "deepseek2.rope.scaling.factor": 40.0,
            "deepseek2.rope.scaling.original_context_length": 4096,
            "deepseek2.rope.scaling.yarn_log_multiplier": 0.1, "deepseek2.context_length": 163840,
            "deepseek2.vocab_size": 129280}
    v3 = ArchConfig.from_gguf_metadata(base)
    with open("tests/fixtures/deepseek_v3/config.json") as f:
        published = ArchConfig.from_hf_config(json.load(f))
    same = ("architecture", "hidden_size", "intermediate_size", "num_layers", "num_heads", "head_dim", "vocab_size",
            "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
            "norm_topk_prob", "mlp_only_layers", "scoring_func", "topk_method", "n_group", "topk_group",
            "routed_scaling_factor", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim",
            "rope_interleave", "max_position_embeddings")
    assert {f: getattr(v3, f) for f in same} == {f: getattr(published, f) for f in same}
    assert v3.rope_scaling["mscale_all_dim"] == pytest.approx(1.0) and v3.rope_scaling["attention_factor"] == 1.0
    v2 = ArchConfig.from_gguf_metadata({**base, "deepseek2.expert_gating_func": 1})
    assert (v2.architecture, v2.scoring_func, v2.topk_method) == ("deepseek_v2", "softmax", "group_limited_greedy")
    with pytest.raises(ValueError, match="expert_gating_func 3 is not supported"):
        ArchConfig.from_gguf_metadata({**base, "deepseek2.expert_gating_func": 3})
    older = {k: v for k, v in base.items() if "_mla" not in k} | {"deepseek2.attention.key_length": 192,
                                                                    "deepseek2.attention.value_length": 128}
    assert ArchConfig.from_gguf_metadata(older).qk_nope_head_dim == 128


@pytest.mark.parametrize("layout", ["F32", "F32 whole kv_b"])
def test_a_tensor_parallel_rank_reads_its_heads_of_either_layout(checkpoint, layout):
    """Each of two ranks reads from the file exactly what it reads from the safetensors directory: its heads' rows of
    q_b / kv_b (joined from attn_k_b / attn_v_b, then cut), their columns of o_proj, the latent projections whole."""
    _, directory, files = checkpoint
    for rank in range(2):
        def weights(path: str) -> dict[str, torch.Tensor]:
            shard = TensorShard(rank, 2, read_arch(path))
            return load_model(ModelConfig(model=path, dtype="float32"), shard=shard).model.weight_destinations()
        ours, want = weights(files[layout]), weights(directory)
        assert sorted(ours) == sorted(want)
        for name in want:
            assert torch.equal(ours[name], want[name]), f"rank {rank}: {name}"
