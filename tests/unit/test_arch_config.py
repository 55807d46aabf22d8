import pytest

from gh200rt.models.arch_config import ArchConfig

BASE = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=100)


def test_classic_rope_fields():
    cfg = ArchConfig.from_hf_config({**BASE, "rope_theta": 500000.0, "rope_scaling": {
        "type": "linear", "factor": 4.0}})
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == {"type": "linear", "factor": 4.0, "rope_type": "linear"}
    assert cfg.head_dim == 16 and cfg.num_kv_heads == 2 and cfg.q_size == 64 and cfg.kv_size == 32


def test_transformers5_rope_parameters():
    params = {"rope_type": "llama3", "rope_theta": 8000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = ArchConfig.from_hf_config({**BASE, "rope_parameters": params})
    assert cfg.rope_theta == 8000.0
    assert cfg.rope_scaling["rope_type"] == "llama3" and "rope_theta" not in cfg.rope_scaling
    plain = ArchConfig.from_hf_config({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert plain.rope_theta == 1e6 and plain.rope_scaling is None


def test_family_flags():
    assert ArchConfig.from_hf_config({**BASE, "model_type": "qwen2"}).attention_bias
    qwen3 = ArchConfig.from_hf_config({**BASE, "model_type": "qwen3", "head_dim": 32})
    assert qwen3.qk_norm and qwen3.head_dim == 32 and not qwen3.attention_bias


def test_unsupported_architecture_lists_supported():
    with pytest.raises(ValueError, match=r"unsupported architecture 'gpt2'.*llama, mistral, qwen2, qwen3"):
        ArchConfig.from_hf_config({**BASE, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="supports: llama"):
        ArchConfig.from_gguf_metadata({"general.architecture": "falcon"})


def test_unsupported_rope_type():
    with pytest.raises(ValueError, match="rope scaling type 'longrope' is not supported; supported: linear, llama3, "
                                         "yarn"):
        ArchConfig.from_hf_config({**BASE, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})


def test_from_gguf_metadata():
    meta = {"general.architecture": "llama", "llama.block_count": 30, "llama.context_length": 8192,
            "llama.embedding_length": 576, "llama.feed_forward_length": 1536, "llama.attention.head_count": 9,
            "llama.attention.head_count_kv": 3, "llama.rope.freq_base": 100000.0,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 49152}
    cfg = ArchConfig.from_gguf_metadata(meta, tie_word_embeddings=True)
    assert (cfg.num_layers, cfg.head_dim, cfg.num_kv_heads, cfg.vocab_size) == (30, 64, 3, 49152)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0


def test_sliding_window_caps_context_instead_of_computing_it_wrong():
    cfg = ArchConfig.from_hf_config({**BASE, "model_type": "mistral", "sliding_window": 4096,
                                     "max_position_embeddings": 32768})
    assert cfg.max_position_embeddings == 4096
    qwen = ArchConfig.from_hf_config({**BASE, "model_type": "qwen2", "sliding_window": 4096,
                                      "use_sliding_window": False, "max_position_embeddings": 32768})
    assert qwen.max_position_embeddings == 32768


MOE = dict(BASE, model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def test_moe_fields_per_family():
    qwen3 = ArchConfig.from_hf_config({**MOE, "norm_topk_prob": True, "decoder_sparse_step": 2})
    assert qwen3.qk_norm and qwen3.norm_topk_prob and qwen3.moe_layers == [1] and not qwen3.routing_weights_fp32
    written_by_transformers5 = {k: v for k, v in MOE.items() if k != "num_experts"} | {"num_local_experts": 4}
    assert ArchConfig.from_hf_config(written_by_transformers5).num_experts == 4
    qwen2 = ArchConfig.from_hf_config({**MOE, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 48,
                                       "mlp_only_layers": [0]})
    assert qwen2.attention_bias and qwen2.shared_expert_intermediate_size == 48 and qwen2.moe_layers == [1]
    mixtral = ArchConfig.from_hf_config({**BASE, "model_type": "mixtral", "num_local_experts": 8,
                                         "num_experts_per_tok": 2})
    assert (mixtral.moe_intermediate_size, mixtral.norm_topk_prob, mixtral.routing_weights_fp32) == (128, True, True)
    assert not ArchConfig.from_hf_config(BASE).is_moe


def test_moe_config_errors():
    with pytest.raises(KeyError, match="shared_expert_intermediate_size"):
        ArchConfig.from_hf_config({**MOE, "model_type": "qwen2_moe"})
    with pytest.raises(ValueError, match="num_experts_per_tok 9 must be in 1..num_experts"):
        ArchConfig.from_hf_config({**MOE, "num_experts_per_tok": 9})
    with pytest.raises(ValueError, match=r"mlp_only_layers \[5\]"):
        ArchConfig.from_hf_config({**MOE, "mlp_only_layers": [5]})
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'glm4moe'"):
        ArchConfig.from_gguf_metadata({"general.architecture": "glm4moe"})
    with pytest.raises(ValueError, match="GGUF metadata lacks deepseek2.embedding_length"):
        ArchConfig.from_gguf_metadata({"general.architecture": "deepseek2"})


GGUF_MOE = {"embedding_length": 64, "attention.head_count": 4, "attention.head_count_kv": 2, "block_count": 2,
            "feed_forward_length": 128, "expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32}


def _gguf(arch: str, **fields) -> dict:
    return {"general.architecture": arch, "tokenizer.ggml.tokens": ["a"] * 16,
            **{f"{arch}.{k}": v for k, v in {**GGUF_MOE, **fields}.items()}}


def test_moe_from_gguf_metadata_follows_llama_cpp_routing():
    qwen3 = ArchConfig.from_gguf_metadata(_gguf("qwen3moe"))
    assert (qwen3.architecture, qwen3.num_experts, qwen3.num_experts_per_tok, qwen3.moe_intermediate_size) == \
        ("qwen3_moe", 8, 2, 32)
    assert qwen3.norm_topk_prob and qwen3.qk_norm and qwen3.moe_layers == [0, 1]
    qwen2 = ArchConfig.from_gguf_metadata(_gguf("qwen2moe", expert_shared_feed_forward_length=48))
    assert (qwen2.architecture, qwen2.shared_expert_intermediate_size, qwen2.norm_topk_prob) == ("qwen2_moe", 48, False)
    assert qwen2.attention_bias
    mixtral = ArchConfig.from_gguf_metadata({k: v for k, v in _gguf("llama").items()
                                             if not k.endswith("expert_feed_forward_length")})
    assert (mixtral.architecture, mixtral.moe_intermediate_size, mixtral.norm_topk_prob,
            mixtral.routing_weights_fp32) == ("mixtral", 128, True, True)
    assert ArchConfig.from_gguf_metadata(_gguf("llama", expert_count=0)).architecture == "llama"


def test_moe_gguf_metadata_errors():
    with pytest.raises(ValueError, match="GGUF metadata lacks qwen3moe.expert_count"):
        ArchConfig.from_gguf_metadata(_gguf("qwen3moe", expert_count=None))
    with pytest.raises(ValueError, match="GGUF metadata lacks qwen3moe.expert_used_count"):
        ArchConfig.from_gguf_metadata(_gguf("qwen3moe", expert_used_count=None))
    with pytest.raises(ValueError, match="expert_gating_func 2 is not supported"):
        ArchConfig.from_gguf_metadata(_gguf("qwen3moe", expert_gating_func=2))
    with pytest.raises(ValueError, match="expert_weights_scale 2.5 is not supported"):
        ArchConfig.from_gguf_metadata(_gguf("qwen2moe", expert_weights_scale=2.5))
    with pytest.raises(ValueError, match="num_experts_per_tok 9 must be in 1..num_experts"):
        ArchConfig.from_gguf_metadata(_gguf("qwen3moe", expert_used_count=9))
