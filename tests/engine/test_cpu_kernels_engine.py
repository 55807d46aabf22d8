"""--cpu-kernels: the native CPU ops are what a CPU engine runs by default, and they generate what the torch
ops generate (the same greedy tokens, or a first difference at a near tie of the torch run)."""
import pytest

from gh200rt.backends.cpu.native import load_native_ops
from gh200rt.config import EngineConfig
from gh200rt.models.layers import rmsnorm
from gh200rt.models.layers.attention import SelfAttention
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel, assert_same_or_near_tie, save_tiny_llama
from tests.engine.test_invariance import make_prompts

needs_native = pytest.mark.skipif(load_native_ops() is None, reason="no C compiler for the native CPU ops")


def hooks(model) -> set[str]:
    attention = next(m for m in model.modules() if isinstance(m, SelfAttention))
    return {attention.attention_fn.__module__, attention.write_kv_fn.__module__}


@needs_native
def test_native_ops_are_the_cpu_default_and_match_torch(tmp_path):
    shared = SharedModel(save_tiny_llama(str(tmp_path / "tiny")))
    prompts = make_prompts(256, count=12)
    torch_llm = shared.llm(cpu_kernels="torch", num_kv_blocks=128)
    assert hooks(shared.model) == {"gh200rt.kv.attention"}
    reference = torch_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2))
    native_llm = shared.llm(num_kv_blocks=128)
    assert hooks(shared.model) == {"gh200rt.backends.cpu.ops"}
    norm = next(m for m in shared.model.modules() if isinstance(m, rmsnorm.RMSNorm))
    assert norm.norm_fn is not rmsnorm.rms_norm
    outputs = native_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert assert_same_or_near_tie(reference, outputs, "native vs torch CPU ops") <= 2


@needs_native
def test_placed_engine_runs_the_native_ops_in_every_tier(short_smollm2):
    from gh200rt.engine.engine import LLMEngine
    engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=short_smollm2, dtype="float32", max_model_len=64,
                                                            offload="none", layer_tiers="1:streamed,2:direct",
                                                            num_kv_blocks=16))
    assert all(hooks(layer) == {"gh200rt.backends.cpu.ops"} for layer in engine.runner.model.layers)


def test_cpu_kernels_flag_is_validated():
    with pytest.raises(ValueError, match="--cpu-kernels 'fast'"):
        EngineConfig.from_kwargs(cpu_kernels="fast")
    assert EngineConfig.from_kwargs(cpu_kernels="torch").model.cpu_kernels == "torch"


@needs_native
def test_torch_kernels_keep_packed_weights_off_the_native_linear(tmp_path, monkeypatch):
    """--cpu-kernels torch reaches int8 / int4 host weights too: their linears run torch's ops, so a broken
    native quantized linear cannot touch that engine (and does touch the default one)."""
    from gh200rt.backends.cpu.native_ops import NativeOps
    from gh200rt.engine.engine import LLMEngine
    path = save_tiny_llama(str(tmp_path / "tiny"), num_layers=2, hidden_size=64, intermediate_size=128)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    def broken(self, *args):
        raise RuntimeError("native quantized linear called")

    monkeypatch.setattr(NativeOps, "quant_linear", broken)
    monkeypatch.setattr(NativeOps, "dequantize", broken)   # a prompt step's row blocks dequantize natively
    for kernels in ("torch", "native"):
        engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64,
                                                                offload="direct", host_weight_dtype="int8",
                                                                num_kv_blocks=16, cpu_kernels=kernels))
        engine.add_request("r", None, params, prompt_token_ids=[5, 6, 7])
        if kernels == "torch":
            while engine.has_unfinished_requests():
                engine.step()
        else:
            with pytest.raises(RuntimeError, match="native quantized linear called"):
                engine.step()
        engine.close()
