"""A random EAGLE-3 head in the published checkpoint format (config.json + model.safetensors or pytorch_model.bin,
``midlayer.*`` names, ``d2t`` / ``t2d``) for a target of given sizes: what ``bench speculative --random-eagle3-head``
drafts with (a random head accepts almost nothing, so it measures what drafting costs), and the tests' heads."""
from __future__ import annotations

import json
import os

import torch


def write_random_eagle3_head(path: str, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                             intermediate: int = 96, vocab: int = 256, draft_vocab: int = 200,
                             aux_ids: list[int] | None = None, seed: int = 0, own_embed: bool = False,
                             weights: str = "model.safetensors", extra: dict | None = None,
                             weights_dtype: torch.dtype | None = None) -> str:
    """A head for a target of ``hidden`` width and ``vocab`` tokens; its draft vocabulary is ``draft_vocab`` target
    ids chosen at random (kept in order, as the published maps are)."""
    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    head_dim = hidden // heads
    dtype = torch.float32 if weights_dtype is None else weights_dtype

    def rand(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    def norm(size):
        return 1.0 + 0.1 * torch.randn(size, generator=g)

    tensors = {
        "fc.weight": rand(hidden, 3 * hidden, scale=0.05),
        "midlayer.input_layernorm.weight": norm(hidden),
        "midlayer.hidden_norm.weight": norm(hidden),
        "midlayer.post_attention_layernorm.weight": norm(hidden),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(intermediate, hidden),
        "midlayer.mlp.up_proj.weight": rand(intermediate, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, intermediate),
        "norm.weight": norm(hidden),
        "lm_head.weight": rand(draft_vocab, hidden, scale=0.3),
    }
    chosen = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
    tensors["d2t"] = chosen - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    tensors["t2d"] = t2d
    if own_embed:
        tensors["embed_tokens.weight"] = rand(vocab, hidden, scale=0.5)
    if weights.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file({k: v.contiguous() if not v.is_floating_point() else v.to(dtype).contiguous()
                   for k, v in tensors.items()}, os.path.join(path, weights))
    else:
        torch.save(tensors, os.path.join(path, weights))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
              "vocab_size": vocab, "draft_vocab_size": draft_vocab, "tie_word_embeddings": False,
              "torch_dtype": "float32", **(extra or {})}
    if aux_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids, "use_aux_hidden_state": True}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path
