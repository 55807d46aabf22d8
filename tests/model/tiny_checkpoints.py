"""Tiny random transformers checkpoints saved as HF directories (safetensors + a tokenizers tokenizer)."""
from __future__ import annotations

import json
import os

import pytest
import torch

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}

# name -> (config class name, kwargs)
FAMILIES = {
    "llama3-gqa-untied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                              rope_parameters=LLAMA3_ROPE)),
    "llama-linear-mha-tied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4,
                                                  tie_word_embeddings=True, rope_parameters=LINEAR_ROPE)),
    "mistral-mha-untied": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=4,
                                                 tie_word_embeddings=False, sliding_window=None)),
    "qwen2-gqa-tied": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3-gqa-untied": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                             tie_word_embeddings=False)),
}
# MoE families (tests/model/test_moe_parity.py): 4 layers, 8 experts of width 32, top 2
MOE_FAMILIES = {
    "qwen3-moe-norm": ("Qwen3MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                              norm_topk_prob=True, tie_word_embeddings=False)),
    "qwen3-moe-sparse-step": ("Qwen3MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                                     norm_topk_prob=False, decoder_sparse_step=2,
                                                     mlp_only_layers=[3], tie_word_embeddings=True)),
    "qwen2-moe-shared": ("Qwen2MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2,
                                                shared_expert_intermediate_size=48, mlp_only_layers=[1],
                                                tie_word_embeddings=False)),
    "mixtral": ("MixtralConfig", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                      num_local_experts=8)),
}
MOE_SIZES = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, num_hidden_layers=4)
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
             "beta_fast": 32, "beta_slow": 1, "mscale": 0.8, "mscale_all_dim": 0.7}
# DeepSeek-V3 families (tests/model/test_deepseek_parity.py): latent attention of rank 32 with 16 rotary and 32
# non-rotary dimensions per query/key head and values of 24, experts of width 32 routed group-limited with a
# correction bias, the first layer dense
_DEEPSEEK = dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=16,
                 qk_nope_head_dim=32, v_head_dim=24, moe_intermediate_size=32, n_shared_experts=1,
                 first_k_dense_replace=1, num_hidden_layers=3, tie_word_embeddings=False)
DEEPSEEK_FAMILIES = {
    # V3's shape: q through a low-rank q_a/q_b, YaRN, interleaved rotary pairs, 8 experts in 4 groups, best 2 groups
    "deepseek-v3": ("DeepseekV3Config", dict(_DEEPSEEK, q_lora_rank=48, rope_parameters=YARN_ROPE,
                                             n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
                                             routed_scaling_factor=2.5)),
    # V2-Lite-like attention: one q_proj, plain RoPE in rotate-half layout; no renormalisation
    "deepseek-v3-plain-q": ("DeepseekV3Config", dict(_DEEPSEEK, q_lora_rank=None, rope_interleave=False,
                                                     n_routed_experts=8, n_group=2, topk_group=1,
                                                     num_experts_per_tok=3, norm_topk_prob=False,
                                                     routed_scaling_factor=1.0)),
    # DeepSeek-V2's softmax routers: V2-Lite's (one q_proj, greedy over all experts, two shared experts) and V2's
    # (q_a/q_b, the best experts' groups, routed_scaling_factor)
    "deepseek-v2-lite": ("DeepseekV2Config", dict(_DEEPSEEK, q_lora_rank=None, n_routed_experts=8, n_shared_experts=2,
                                                  num_experts_per_tok=2, topk_method="greedy", norm_topk_prob=False,
                                                  routed_scaling_factor=1.0)),
    "deepseek-v2": ("DeepseekV2Config", dict(_DEEPSEEK, q_lora_rank=48, n_routed_experts=8, n_group=4, topk_group=2,
                                             num_experts_per_tok=3, topk_method="group_limited_greedy",
                                             norm_topk_prob=False, routed_scaling_factor=16.0)),
    # Kimi-K2's routing: one group (no group limit), many experts, a larger k, scaling 2.827
    "kimi-k2": ("DeepseekV3Config", dict(_DEEPSEEK, q_lora_rank=48, n_routed_experts=12, n_group=1, topk_group=1,
                                         num_experts_per_tok=4, routed_scaling_factor=2.827)),
}
# GLM-4.5's shape (tests/model/test_deepseek_parity.py): GQA with q/k/v bias, RoPE over half of each head, the first
# layer dense, DeepSeek-V3's router over 8 experts, one shared expert; with and without the q/k norm
_GLM = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=True, moe_intermediate_size=32,
            n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, num_hidden_layers=3,
            routed_scaling_factor=2.5, tie_word_embeddings=False)
GLM_FAMILIES = {
    "glm4-moe-qk-norm": ("Glm4MoeConfig", dict(_GLM, use_qk_norm=True, n_group=2, topk_group=1,
                                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 0.5})),
    "glm4-moe": ("Glm4MoeConfig", dict(_GLM, use_qk_norm=False,
                                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.5})),
}
VOCAB = 256


def make_hf_model(family: str, seed: int = 0, **overrides):
    """``overrides``: config fields replacing the family's (e.g. ``mlp_only_layers=[]``)."""
    import transformers
    if family in DEEPSEEK_FAMILIES or family in GLM_FAMILIES:
        class_name, kwargs = {**DEEPSEEK_FAMILIES, **GLM_FAMILIES}[family]
    elif family in MOE_FAMILIES:
        class_name, kwargs = MOE_FAMILIES[family]
        sizes = {k: v for k, v in MOE_SIZES.items() if class_name != "MixtralConfig" or k in (
            "num_experts_per_tok", "num_hidden_layers")}
        kwargs = {**sizes, **kwargs}
        if class_name == "MixtralConfig":
            kwargs["intermediate_size"] = 32   # Mixtral's experts are intermediate_size wide
    else:
        class_name, kwargs = FAMILIES[family]
    kwargs = {**kwargs, **overrides}
    config = getattr(transformers, class_name)(**{
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "rms_norm_eps": 1e-6, **kwargs})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.15)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):   # steers the choice: zero would test nothing
                b.normal_(0.0, 0.1)
    return model


CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def write_tokenizer(path: str, vocab_size: int = VOCAB, chat_template: str | None = CHAT_TEMPLATE) -> None:
    """A word-level tokenizer over "w3" ... "w{vocab_size-1}" with <unk>/<s>/</s> at ids 0-2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(path, "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "tokenizer_class": "PreTrainedTokenizerFast"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def checkpoint_fixture(families: dict):
    """A module-scoped fixture over ``families``: each one's (family, directory, the transformers model saved there)."""
    @pytest.fixture(scope="module", params=sorted(families))
    def checkpoint(request, tmp_path_factory):
        path = str(tmp_path_factory.mktemp(request.param))
        return request.param, path, save_tiny(request.param, path)
    return checkpoint


def save_tiny(family: str, path: str, seed: int = 0, **overrides):
    model = make_hf_model(family, seed, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    return model


FP8_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
FP8_CONFIGS = {
    "fp8": {"quant_method": "fp8", "activation_scheme": "static"},
    "compressed-tensors": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                  "symmetric": True, "dynamic": False},
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                            "symmetric": True, "dynamic": False}}}},
}


def to_fp8_checkpoint(path: str, method: str = "fp8", kv_scales: dict[int, tuple[float, float]] | None = None
                      ) -> dict[str, torch.Tensor]:
    """Rewrite the safetensors checkpoint in ``path`` in the Hugging Face FP8 layout: each decoder linear
    ``weight`` as float8_e4m3fn with ``weight_scale`` (per tensor for attention, per output channel for the
    MLP) and a static ``input_scale``; ``quantization_config`` in config.json. ``kv_scales``: layer ->
    (k_scale, v_scale) to store as ``self_attn.k_scale`` / ``v_scale``. Returns the dequantized weights
    (``weight x weight_scale`` in float32) by name, what a loader must reproduce."""
    from safetensors.torch import load_file, save_file
    file = os.path.join(path, "model.safetensors")
    tensors, dequantized = load_file(file), {}
    for name in list(tensors):
        if not name.endswith(".weight") or not any(f".{lin}." in name for lin in FP8_LINEARS):
            continue
        w = tensors[name].float()
        per_channel = ".mlp." in name
        amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1)
        scale = amax / 448.0
        q = (w / (scale if per_channel else scale[0])).clamp(-448, 448).to(torch.float8_e4m3fn)
        tensors[name] = q
        tensors[name[:-len("weight")] + "weight_scale"] = scale
        tensors[name[:-len("weight")] + "input_scale"] = torch.tensor([0.05])
        dequantized[name] = q.float() * (scale if per_channel else scale[0])
    for layer, (k, v) in (kv_scales or {}).items():
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k)
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(v)
    save_file(tensors, file, metadata={"format": "pt"})
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["quantization_config"] = FP8_CONFIGS[method]
    with open(config_path, "w") as f:
        json.dump(config, f)
    return dequantized
