"""``read_embeddings``: a checkpoint's whole embedding matrix read on its own (what an EAGLE-3 head on a
tensor-parallel rank 0 shares), equal to what the loader gives the model, from safetensors and from a quantized
GGUF file; a shape other than the target's is refused."""
import pytest
import torch
from safetensors.torch import load_file

from gh200rt.config.model import ModelConfig
from gh200rt.loader.embeddings import read_embeddings
from gh200rt.loader.errors import ModelLoadError
from gh200rt.loader.load import load_model
from tests.engine.real_models import save_tiny_llama


def test_the_matrix_is_the_one_the_loader_reads(tmp_path):
    pytest.importorskip("gguf")
    from tests.model.tiny_gguf import write_gguf
    path = save_tiny_llama(str(tmp_path / "llama"))
    got = read_embeddings(path, (256, 64), torch.float32, "cpu")
    assert torch.equal(got, load_file(f"{path}/model.safetensors")["model.embed_tokens.weight"])
    gguf_path = str(tmp_path / "model.gguf")
    write_gguf(path, gguf_path, "Q8_0")
    loaded = load_model(ModelConfig(model=gguf_path, dtype="float32"))
    got = read_embeddings(gguf_path, (256, 64), torch.float32, "cpu")
    assert torch.equal(got, loaded.model.embed_tokens)
    assert not torch.equal(got, load_file(f"{path}/model.safetensors")["model.embed_tokens.weight"])   # quantized
    with pytest.raises(ModelLoadError, match=r"the embeddings have shape \(256, 64\), expected \(512, 64\)"):
        read_embeddings(path, (512, 64), torch.float32, "cpu")
