"""Dense layer linears left in the checkpoint until the weight store needs them (loader/deferred_layers.py): with a
quantized host format a first start reads each offloaded layer just before quantizing it, a restart from the slab
cache reads none of them, resident layers are read at placement, and the result is the same bits and tokens as
loading everything up front. The loader stays strict about what it leaves unread."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from gh200rt.engine import bootstrap
from gh200rt.loader.errors import ModelLoadError
from tests.tiers.test_engine_placement import engine, run, tiny_dir  # noqa: F401 (fixture)
from tests.tiers.test_slab_cache import LAYERS, slab_bytes


def loaded_everything_up_front(monkeypatch):
    real = bootstrap.load_model
    monkeypatch.setattr(bootstrap, "load_model", lambda *a, **k: real(*a, **{**k, "defer_layer_linears": False}))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_offloaded_layers_are_read_when_quantized_and_not_at_all_from_the_cache(tiny_dir, tmp_path, monkeypatch,  # noqa: F811
                                                                                fmt):
    options = dict(offload="none", layer_tiers=",".join(f"{i}:streamed" for i in range(1, LAYERS)), staging_slots=2,
                   prefetch_distance=1, host_weight_dtype=fmt, host_weight_cache_dir=str(tmp_path))
    first = engine(tiny_dir, **options)
    deferred = first.store.deferred
    assert deferred is not None and sorted(deferred.layers_loaded) == list(range(LAYERS))
    want_tokens, want_bytes = run(first), slab_bytes(first)
    first.close()
    restart = engine(tiny_dir, **options)
    assert restart.store.deferred.layers_loaded == [0], "only the resident layer is read; the cache holds the rest"
    assert restart.store.slab_cache.hits == LAYERS - 1
    got = slab_bytes(restart)
    assert all(torch.equal(got[name], want_bytes[name]) for name in want_bytes)
    assert run(restart) == want_tokens
    restart.close()
    with monkeypatch.context() as m:
        loaded_everything_up_front(m)
        eager = engine(tiny_dir, **{**options, "host_weight_cache_dir": None})
    assert eager.store.deferred is None
    got = slab_bytes(eager)
    assert all(torch.equal(got[name], want_bytes[name]) for name in want_bytes)
    assert run(eager) == want_tokens, "deferred reading gives the bits of reading everything at once"
    eager.close()


def test_dense_host_formats_load_everything_at_once(tiny_dir):  # noqa: F811
    eng = engine(tiny_dir, offload="stream")   # float32 slabs: nothing to defer
    assert eng.store.deferred is None
    eng.close()


@pytest.fixture
def damaged_dir(tiny_dir, tmp_path):  # noqa: F811
    """The tiny checkpoint with layer 3's down projection one column short."""
    out = tmp_path / "damaged"
    out.mkdir()
    for entry in os.scandir(tiny_dir):
        target = out / entry.name
        if entry.name.endswith(".safetensors"):
            tensors = load_file(entry.path)
            name = "model.layers.3.mlp.down_proj.weight"
            if name in tensors:
                tensors[name] = tensors[name][:, :-1].contiguous()
            save_file(tensors, str(target), metadata={"format": "pt"})
        else:
            target.write_bytes(open(entry.path, "rb").read())
    return str(out)


def test_an_unread_tensor_is_still_checked_against_the_config(damaged_dir):
    with pytest.raises(ModelLoadError, match=r"model.layers.3.mlp.down_proj.weight has shape"):
        engine(damaged_dir, offload="stream", host_weight_dtype="int8")


def test_a_missing_tensor_is_named_at_load(tiny_dir, tmp_path):  # noqa: F811
    out = tmp_path / "missing"
    out.mkdir()
    for entry in os.scandir(tiny_dir):
        if entry.name.endswith(".safetensors"):
            tensors = {k: v for k, v in load_file(entry.path).items() if k != "model.layers.2.self_attn.k_proj.weight"}
            save_file(tensors, str(out / entry.name), metadata={"format": "pt"})
        else:
            (out / entry.name).write_bytes(open(entry.path, "rb").read())
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == LAYERS
    with pytest.raises(ModelLoadError, match=r"missing weights: model.layers.2.self_attn.k_proj.weight"):
        engine(str(out), offload="stream", host_weight_dtype="int8")


def test_a_bf16_model_quantizes_the_rounded_weights_like_its_dense_copy(tiny_dir, monkeypatch):  # noqa: F811
    """The tiny checkpoint is float32: a bfloat16 model rounds each tensor to bf16 before quantizing it, from the
    checkpoint's map exactly as from the dense copy."""
    from gh200rt.config import EngineConfig
    from gh200rt.engine.engine import LLMEngine

    def start():
        config = EngineConfig.from_kwargs(model=tiny_dir, dtype="bfloat16", max_model_len=128, offload="stream",
                                          host_weight_dtype="int4")
        return LLMEngine.from_config(config)
    deferred = start()
    assert deferred.store.deferred is not None and deferred.store.compute_dtype == torch.bfloat16
    want = slab_bytes(deferred)
    deferred.close()
    loaded_everything_up_front(monkeypatch)
    eager = start()
    got = slab_bytes(eager)
    eager.close()
    assert all(torch.equal(got[name], want[name]) for name in want)
