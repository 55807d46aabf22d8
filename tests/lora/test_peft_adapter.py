"""Reading PEFT adapter directories: what is served, and a clear error naming the problem for what is not."""
from __future__ import annotations

import json
import os

import pytest
import torch

from gh200rt.config import EngineConfig, LoRAConfig
from gh200rt.lora.peft_adapter import LoraAdapterError, read_peft_adapter
from gh200rt.lora.request import LoRAModulePath, parse_lora_modules
from gh200rt.models.arch_config import ArchConfig
from tests.lora.peft_files import write_peft_adapter
from tests.model.tiny_checkpoints import make_hf_model


@pytest.fixture(scope="module")
def hf():
    return make_hf_model("llama3-gqa-untied")


@pytest.fixture(scope="module")
def arch(hf):
    return ArchConfig.from_hf_config(hf.config.to_dict())


def read(path, arch, max_rank=16):
    return read_peft_adapter(path, arch, max_rank, torch.float32)


def test_reads_fused_parts_with_scale(tmp_path, hf, arch):
    path = write_peft_adapter(str(tmp_path / "a"), hf, r=4, alpha=8, targets=("q_proj", "v_proj", "up_proj"))
    adapter = read(path, arch)
    assert adapter.rank == 4 and adapter.scale == 2.0
    qkv = adapter.weights[(0, "self_attn.qkv_proj")]
    assert qkv[1] is None and qkv[0][0].shape == (4, 64) and qkv[2][1].shape == (arch.kv_size, 4)
    assert adapter.weights[(1, "mlp.gate_up_proj")][0] is None
    rs = write_peft_adapter(str(tmp_path / "rs"), hf, r=4, alpha=8, targets=("o_proj",), use_rslora=True)
    assert read(rs, arch).scale == 4.0


@pytest.mark.parametrize("changes,match", [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "biases"),
    ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"),
    ({"peft_type": "IA3"}, "only LORA"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "embedding or lm_head"),
    ({"target_modules": ["c_attn"]}, "not a linear this model has"),
])
def test_refuses_what_is_not_served(tmp_path, hf, arch, changes, match):
    path = write_peft_adapter(str(tmp_path / "a"), hf, r=4, alpha=8, targets=("q_proj",), config_changes=changes)
    with pytest.raises(LoraAdapterError, match=match):
        read(path, arch)


def test_refuses_rank_above_max_and_foreign_shapes(tmp_path, hf, arch):
    path = write_peft_adapter(str(tmp_path / "big"), hf, r=32, alpha=8, targets=("q_proj",))
    with pytest.raises(LoraAdapterError, match="--max-lora-rank 16; raise --max-lora-rank to at least 32"):
        read(path, arch)
    other = make_hf_model("llama3-gqa-untied", hidden_size=32)
    path = write_peft_adapter(str(tmp_path / "other"), other, r=4, alpha=8, targets=("q_proj",))
    with pytest.raises(LoraAdapterError, match="another base model"):
        read(path, arch)


def test_refuses_embedding_tensors_missing_halves_and_missing_files(tmp_path, hf, arch):
    emb = {"base_model.model.model.embed_tokens.lora_embedding_A": torch.zeros(4, 256)}
    path = write_peft_adapter(str(tmp_path / "emb"), hf, r=4, alpha=8, targets=("q_proj",), extra_tensors=emb)
    with pytest.raises(LoraAdapterError, match="embedding adapter"):
        read(path, arch)
    path = write_peft_adapter(str(tmp_path / "half"), hf, r=4, alpha=8, targets=("q_proj",))
    from safetensors.torch import load_file, save_file
    file = os.path.join(path, "adapter_model.safetensors")
    tensors = {k: v for k, v in load_file(file).items() if "layers.1" not in k or "lora_A" in k}
    save_file(tensors, file)
    with pytest.raises(LoraAdapterError, match="has no lora_B"):
        read(path, arch)
    with pytest.raises(LoraAdapterError, match="no such directory"):
        read(str(tmp_path / "nowhere"), arch)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoraAdapterError, match="no adapter_config.json"):
        read(str(tmp_path / "empty"), arch)
    with open(tmp_path / "empty" / "adapter_config.json", "w") as f:
        json.dump({"r": 4, "lora_alpha": 8, "peft_type": "LORA"}, f)
    with pytest.raises(LoraAdapterError, match="no adapter_model.safetensors"):
        read(str(tmp_path / "empty"), arch)


def test_lora_modules_flag_forms_and_config_checks():
    assert parse_lora_modules(("sql=/a/sql", '{"name": "chat", "path": "/a/chat", "base_model_name": "m"}')) == (
        LoRAModulePath("sql", "/a/sql"), LoRAModulePath("chat", "/a/chat", "m"))
    with pytest.raises(ValueError, match="name=path"):
        parse_lora_modules(("just-a-path",))
    with pytest.raises(ValueError, match="more than once"):
        parse_lora_modules(("a=/x", "a=/y"))
    with pytest.raises(ValueError, match="add --enable-lora"):
        LoRAConfig(lora_modules=("a=/x",))
    with pytest.raises(ValueError, match="--max-cpu-loras"):
        LoRAConfig(enable_lora=True, max_loras=4, max_cpu_loras=2)
    assert EngineConfig.from_kwargs(enable_lora=True, tensor_parallel_size=2).lora.enable_lora   # tests/distributed
    with pytest.raises(ValueError, match="--no-enforce-eager"):
        EngineConfig.from_kwargs(enable_lora=True, enforce_eager=False)
    config = EngineConfig.from_kwargs(enable_lora=True)
    assert not config.use_graphs("cuda"), "LoRA runs eagerly"


def test_cli_flags_are_generated():
    from gh200rt.serve.args import parse_args
    _, engine = parse_args(["--enable-lora", "--lora-modules", "a=/x", "b=/y", "--max-loras", "2",
                            "--max-lora-rank", "32", "--max-cpu-loras", "4", "--enable-runtime-lora-updating"])
    assert engine.lora.lora_modules == ("a=/x", "b=/y") and engine.lora.max_loras == 2
    assert engine.lora.max_lora_rank == 32 and engine.lora.cpu_loras == 4 and engine.lora.enable_runtime_lora_updating
