"""What other subsystems rely on: WeightRef indirection, the runner's layer hooks around a pure model, the
loader writing through refs."""
import torch

from gh200rt.config import ModelConfig
from gh200rt.loader import load_model
from gh200rt.models.arch_config import ArchConfig
from gh200rt.models.registry import build_model
from tests.model.paged_runner import PagedRunner
from gh200rt.weights.schedule import LayerHooks
from tests.model.tiny_checkpoints import save_tiny


class RecordingSchedule(LayerHooks):
    def __init__(self):
        self.calls = []

    def begin_step(self, num_tokens):
        self.calls.append(("begin", num_tokens))

    def before_layer(self, index):
        self.calls.append(("before", index))

    def after_layer(self, index):
        self.calls.append(("after", index))


class PackedWeight:
    """Stands in for a quantized weight: computes through its own linear()."""

    def __init__(self, dense):
        self.dense, self.calls = dense.clone(), 0
        self.nbytes = dense.nbytes

    def linear(self, x, bias):
        self.calls += 1
        return torch.nn.functional.linear(x, self.dense, bias)


def test_schedule_hooks_and_packed_weights(tmp_path):
    save_tiny("qwen2-gqa-tied", str(tmp_path))
    model = load_model(ModelConfig(model=str(tmp_path))).model
    ids = list(range(3, 40))
    before = PagedRunner(model).prefill(ids)
    schedule = RecordingSchedule()
    refs = model.layer_weight_refs(1)
    assert set(refs) == {"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"}
    packed = PackedWeight(refs["mlp.down_proj"].current)
    refs["mlp.down_proj"].current = packed
    after = PagedRunner(model, hooks=schedule).prefill(ids)
    assert schedule.calls == [("begin", len(ids)), ("before", 0), ("after", 0), ("before", 1), ("after", 1)]
    assert packed.calls == 1
    assert torch.equal(before, after)
    assert torch.equal(PagedRunner(model).prefill(ids), after)   # the model alone: the same, with no hooks


def test_loader_writes_through_repointed_refs(tmp_path):
    save_tiny("llama3-gqa-untied", str(tmp_path))
    reference = load_model(ModelConfig(model=str(tmp_path), dtype="float32")).model
    from gh200rt.loader.safetensors_dir import load_safetensors, shard_files
    from gh200rt.loader.weight_writer import WeightWriter
    import json
    with open(tmp_path / "config.json") as f:
        arch = ArchConfig.from_hf_config(json.load(f))
    model = build_model(arch, torch.float32)
    slab = torch.full(model.layer_weight_refs(0)["self_attn.qkv_proj"].shape, float("nan"))
    model.layer_weight_refs(0)["self_attn.qkv_proj"].current = slab  # e.g. a host-slab view
    writer = WeightWriter(model, str(tmp_path), 0, 0)
    load_safetensors(shard_files(str(tmp_path)), writer, torch.float32)
    writer.finish()
    assert torch.equal(slab, reference.layer_weight_refs(0)["self_attn.qkv_proj"].current)
