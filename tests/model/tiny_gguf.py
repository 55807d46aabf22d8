"""Write a transformers MoE model (or a dense Llama) as llama.cpp's converter (convert_hf_to_gguf.py) writes it, with the ``gguf``
package: GGUF names, experts stacked per projection ``[E, rows, cols]``, q/k rows permuted for the llama
architecture (Mixtral), 1-D tensors squeezed and kept F32, the router kept F32 (llama.cpp's quantizer skips
``ffn_gate_inp``), other 2-D tensors in ``qtype`` where their rows are whole blocks (else F32, as llama.cpp
falls back), and a byte-level BPE vocabulary of the model's size for the tokenizer."""
from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import numpy as np

# transformers model_type -> (GGUF architecture, the sparse block's checkpoint prefix, expert names gate/up/down)
GGUF_ARCH = {"qwen3_moe": ("qwen3moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
             "qwen2_moe": ("qwen2moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
             "mixtral": ("llama", "block_sparse_moe", ("w1", "w3", "w2")),
             "llama": ("llama", "mlp", ())}     # dense: no expert stacks
LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
         "block_sparse_moe.gate": "ffn_gate_inp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
         "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
         "mlp.shared_expert.down_proj": "ffn_down_shexp",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
STACKS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: rotate-half rows -> interleaved pairs."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2) \
        .reshape(weights.shape)


def _config(directory: str) -> dict:
    with open(os.path.join(directory, "config.json")) as f:
        return json.load(f)


def _experts(cfg: dict) -> int:
    return cfg.get("num_local_experts", cfg.get("num_experts", 0))


def gguf_tensors(directory: str) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy order) for the safetensors checkpoint in ``directory``."""
    from safetensors.numpy import load_file
    cfg = _config(directory)
    arch, block, expert_names = GGUF_ARCH[cfg["model_type"]]
    state = {k: v.astype(np.float32) for k, v in load_file(os.path.join(directory, "model.safetensors")).items()}
    out = {"token_embd.weight": state.pop("model.embed_tokens.weight"),
           "output_norm.weight": state.pop("model.norm.weight")}
    if "lm_head.weight" in state:
        out["output.weight"] = state.pop("lm_head.weight")
    for i in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        for stack, name in zip(STACKS, expert_names):
            out[f"blk.{i}.{stack}.weight"] = np.stack(
                [state.pop(f"{prefix}{block}.experts.{e}.{name}.weight") for e in range(_experts(cfg))])
        for hf_part, gguf_part in LAYER.items():
            for kind in ("weight", "bias"):
                value = state.pop(f"{prefix}{hf_part}.{kind}", None)
                if value is None:
                    continue
                if arch == "llama" and hf_part in ("self_attn.q_proj", "self_attn.k_proj"):
                    value = permute(value, cfg["num_attention_heads"] if hf_part.endswith("q_proj")
                                    else cfg["num_key_value_heads"])
                out[f"blk.{i}.{gguf_part}.{kind}"] = value.squeeze()
    assert not state, f"weights the GGUF writer does not place: {sorted(state)}"
    return out


def write_gguf(directory: str, path: str, qtype: str = "F32", tensors: dict[str, np.ndarray] | None = None) -> None:
    """The tiny transformers MoE checkpoint in ``directory`` as a GGUF file at ``path``; ``qtype``: F32, F16 or a
    block type the ``gguf`` package quantizes (Q8_0 ...). ``tensors`` replaces ``gguf_tensors(directory)``."""
    import gguf
    cfg = SimpleNamespace(**_config(directory))
    arch, _, _ = GGUF_ARCH[cfg.model_type]
    keys = gguf.Keys.LLM
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32(keys.BLOCK_COUNT.format(arch=arch), cfg.num_hidden_layers)
    w.add_uint32(keys.CONTEXT_LENGTH.format(arch=arch), cfg.max_position_embeddings)
    w.add_uint32(keys.EMBEDDING_LENGTH.format(arch=arch), cfg.hidden_size)
    w.add_uint32(keys.FEED_FORWARD_LENGTH.format(arch=arch), cfg.intermediate_size)
    w.add_uint32(gguf.Keys.Attention.HEAD_COUNT.format(arch=arch), cfg.num_attention_heads)
    w.add_uint32(gguf.Keys.Attention.HEAD_COUNT_KV.format(arch=arch), cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_uint32(gguf.Keys.Attention.KEY_LENGTH.format(arch=arch), head_dim)
    w.add_uint32(gguf.Keys.Attention.VALUE_LENGTH.format(arch=arch), head_dim)
    w.add_float32(gguf.Keys.Attention.LAYERNORM_RMS_EPS.format(arch=arch), cfg.rms_norm_eps)
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", None) \
        or 10000.0
    w.add_float32(gguf.Keys.Rope.FREQ_BASE.format(arch=arch), float(theta))
    if _experts(vars(cfg)):
        w.add_uint32(keys.EXPERT_COUNT.format(arch=arch), _experts(vars(cfg)))
        w.add_uint32(keys.EXPERT_USED_COUNT.format(arch=arch), cfg.num_experts_per_tok)
    if cfg.model_type not in ("mixtral", "llama"):
        w.add_uint32(keys.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch), cfg.moe_intermediate_size)
    if cfg.model_type == "qwen2_moe":
        w.add_uint32(keys.EXPERT_SHARED_FEED_FORWARD_LENGTH.format(arch=arch), cfg.shared_expert_intermediate_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
    w.add_token_types([1] * cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, value in (tensors if tensors is not None else gguf_tensors(directory)).items():
        _add(w, gguf, name, value, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add(w, gguf, name: str, value: np.ndarray, qtype: str) -> None:
    value = np.ascontiguousarray(value, dtype=np.float32)
    kind = gguf.GGMLQuantizationType[qtype]
    block = gguf.GGML_QUANT_SIZES[kind][0]
    if value.ndim == 1 or "ffn_gate_inp" in name or kind == gguf.GGMLQuantizationType.F32 \
            or value.shape[-1] % block:
        w.add_tensor(name, value)
    elif kind == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, value.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(value, kind), raw_dtype=kind)


def dequantized_twin(directory: str, twin: str, qtype: str) -> None:
    """Copy the checkpoint in ``directory`` to ``twin`` with every weight ``write_gguf(..., qtype)`` quantizes
    replaced by its dequantized blocks: loading ``twin`` and that GGUF file must give the same bits."""
    import gguf
    from safetensors.numpy import load_file, save_file
    shutil.copytree(directory, twin)
    kind = gguf.GGMLQuantizationType[qtype]
    block = gguf.GGML_QUANT_SIZES[kind][0]
    file = os.path.join(twin, "model.safetensors")
    state = load_file(file)
    for name, value in state.items():
        if value.ndim == 2 and not name.endswith((".gate.weight", "shared_expert_gate.weight")) \
                and value.shape[-1] % block == 0:
            state[name] = gguf.quants.dequantize(gguf.quants.quantize(value.astype(np.float32), kind), kind)
    save_file(state, file, metadata={"format": "pt"})
