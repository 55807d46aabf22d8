"""Write a transformers MoE model (or a dense Llama) as llama.cpp's converter (convert_hf_to_gguf.py) writes it, with
the ``gguf`` package: GGUF names, experts stacked per projection ``[E, rows, cols]``, q/k rows permuted for the llama
architecture (Mixtral), 1-D tensors squeezed and kept F32, the router kept F32 (llama.cpp's quantizer skips
``ffn_gate_inp``), other 2-D tensors in ``qtype`` where their rows are whole blocks (else F32, as llama.cpp
falls back), and a byte-level BPE vocabulary of the model's size for the tokenizer."""
from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import numpy as np
import torch

from gh200rt.config import ModelConfig
from gh200rt.loader import load_model
from tests.model.paged_runner import PagedRunner
from tests.model.test_parity_tiny import prompt, relative_error

# transformers model_type -> (GGUF architecture, the sparse block's checkpoint prefix, expert names gate/up/down)
GGUF_ARCH = {"qwen3_moe": ("qwen3moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
             "qwen2_moe": ("qwen2moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
             "mixtral": ("llama", "block_sparse_moe", ("w1", "w3", "w2")),
             "deepseek_v3": ("deepseek2", "mlp", ("gate_proj", "up_proj", "down_proj")),
             "deepseek_v2": ("deepseek2", "mlp", ("gate_proj", "up_proj", "down_proj")),
             "llama": ("llama", "mlp", ())}     # dense: no expert stacks
NEXTN = {"eh_proj": "eh_proj", "enorm": "enorm", "hnorm": "hnorm", "embed_tokens": "embed_tokens",
         "shared_head.head": "shared_head_head", "shared_head.norm": "shared_head_norm"}
LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
         "block_sparse_moe.gate": "ffn_gate_inp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
         "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
         "mlp.shared_expert.down_proj": "ffn_down_shexp",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         # deepseek2: latent attention, DeepSeekMoE's shared experts and correction bias
         "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
         "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
         "self_attn.kv_b_proj": "attn_kv_b", "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
         "mlp.shared_experts.up_proj": "ffn_up_shexp", "mlp.shared_experts.down_proj": "ffn_down_shexp"}
STACKS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: rotate-half rows -> interleaved pairs."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2) \
        .reshape(weights.shape)


def _config(directory: str) -> dict:
    with open(os.path.join(directory, "config.json")) as f:
        return json.load(f)


def _experts(cfg: dict) -> int:
    return cfg.get("num_local_experts", cfg.get("num_experts", cfg.get("n_routed_experts", 0)))


def split_kv_b(kv_b: np.ndarray, cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's split of a deepseek2 kv_b_proj: attn_k_b ``[heads, rank, nope]`` (W_UK transposed) and attn_v_b
    ``[heads, v, rank]``."""
    heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    per_head = kv_b.reshape(heads, nope + v, kv_b.shape[-1])
    return np.ascontiguousarray(per_head[:, :nope].transpose(0, 2, 1)), np.ascontiguousarray(per_head[:, nope:])


def gguf_tensors(directory: str, split: bool = True, mtp: bool = False) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy order) for the safetensors checkpoint in ``directory``. ``split``: a
    deepseek2 file's kv_b_proj as attn_k_b and attn_v_b (llama.cpp's converter since its MLA rework), else whole;
    ``mtp``: the checkpoint's multi-token-prediction layers too, as llama.cpp writes them (blocks past the model's,
    their own tensors under ``nextn.``)."""
    from safetensors.numpy import load_file
    cfg = _config(directory)
    arch, block, expert_names = GGUF_ARCH[cfg["model_type"]]
    state = {k: v.astype(np.float32) for k, v in load_file(os.path.join(directory, "model.safetensors")).items()}
    out = {"token_embd.weight": state.pop("model.embed_tokens.weight"),
           "output_norm.weight": state.pop("model.norm.weight")}
    if "lm_head.weight" in state:
        out["output.weight"] = state.pop("lm_head.weight")
    layers = cfg["num_hidden_layers"]
    for i in range(layers + int(cfg.get("num_nextn_predict_layers") or 0) if mtp else layers):
        prefix = f"model.layers.{i}."
        for hf_part, gguf_part in NEXTN.items():       # a multi-token-prediction layer's own tensors
            value = state.pop(f"{prefix}{hf_part}.weight", None)
            if value is not None:
                out[f"blk.{i}.nextn.{gguf_part}.weight"] = value
        for stack, name in zip(STACKS, expert_names):
            if f"{prefix}{block}.experts.0.{name}.weight" not in state:     # a dense layer (first_k_dense_replace)
                continue
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
        bias = state.pop(f"{prefix}mlp.gate.e_score_correction_bias", None)
        if bias is not None:
            out[f"blk.{i}.exp_probs_b.bias"] = bias
        if arch == "deepseek2" and split:
            out[f"blk.{i}.attn_k_b.weight"], out[f"blk.{i}.attn_v_b.weight"] = \
                split_kv_b(out.pop(f"blk.{i}.attn_kv_b.weight"), cfg)
    assert not state, f"weights the GGUF writer does not place: {sorted(state)}"
    return out


def write_gguf(directory: str, path: str, qtype: str = "F32", tensors: dict[str, np.ndarray] | None = None,
               split: bool = True, nextn_blocks: int = 0) -> None:
    """The tiny transformers MoE checkpoint in ``directory`` as a GGUF file at ``path``; ``qtype``: F32, F16 or a
    block type the ``gguf`` package quantizes (Q8_0 ...). ``tensors`` replaces ``gguf_tensors(directory, split)``;
    ``split``: a deepseek2 file as llama.cpp writes it now (attn_k_b / attn_v_b, latent attention described as
    multi-query), else as it did before (attn_kv_b, per-head key and value lengths); ``nextn_blocks``: blocks past
    the model's that ``tensors`` holds (multi-token prediction, counted in block_count as llama.cpp does)."""
    import gguf
    cfg = SimpleNamespace(**_config(directory))
    arch, _, _ = GGUF_ARCH[cfg.model_type]
    keys = gguf.Keys.LLM
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32(keys.BLOCK_COUNT.format(arch=arch), cfg.num_hidden_layers + nextn_blocks)
    if nextn_blocks:
        w.add_uint32(keys.NEXTN_PREDICT_LAYERS.format(arch=arch), nextn_blocks)
    w.add_uint32(keys.CONTEXT_LENGTH.format(arch=arch), cfg.max_position_embeddings)
    w.add_uint32(keys.EMBEDDING_LENGTH.format(arch=arch), cfg.hidden_size)
    w.add_uint32(keys.FEED_FORWARD_LENGTH.format(arch=arch), cfg.intermediate_size)
    w.add_uint32(gguf.Keys.Attention.HEAD_COUNT.format(arch=arch), cfg.num_attention_heads)
    if arch != "deepseek2":        # its own below
        w.add_uint32(gguf.Keys.Attention.HEAD_COUNT_KV.format(arch=arch), cfg.num_key_value_heads)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        w.add_uint32(gguf.Keys.Attention.KEY_LENGTH.format(arch=arch), head_dim)
        w.add_uint32(gguf.Keys.Attention.VALUE_LENGTH.format(arch=arch), head_dim)
    w.add_float32(gguf.Keys.Attention.LAYERNORM_RMS_EPS.format(arch=arch), cfg.rms_norm_eps)
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", None) \
        or 10000.0
    w.add_float32(gguf.Keys.Rope.FREQ_BASE.format(arch=arch), float(theta))
    if _experts(vars(cfg)) and arch != "deepseek2":
        w.add_uint32(keys.EXPERT_COUNT.format(arch=arch), _experts(vars(cfg)))
        w.add_uint32(keys.EXPERT_USED_COUNT.format(arch=arch), cfg.num_experts_per_tok)
    if cfg.model_type not in ("mixtral", "llama") and arch != "deepseek2":
        w.add_uint32(keys.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch), cfg.moe_intermediate_size)
    if cfg.model_type == "qwen2_moe":
        w.add_uint32(keys.EXPERT_SHARED_FEED_FORWARD_LENGTH.format(arch=arch), cfg.shared_expert_intermediate_size)
    if arch == "deepseek2":
        _deepseek2_metadata(w, gguf, vars(cfg), split)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
    w.add_token_types([1] * cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, value in (tensors if tensors is not None else gguf_tensors(directory, split)).items():
        _add(w, gguf, name, value, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _deepseek2_metadata(w, gguf, cfg: dict, split: bool) -> None:
    """What llama.cpp's DeepseekV2Model converter writes beside the common keys (overriding key/value lengths)."""
    def key(name: str) -> str:
        return name.format(arch="deepseek2")
    attention, llm, rope = gguf.Keys.Attention, gguf.Keys.LLM, gguf.Keys.Rope
    rank, rope_dim = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    qk, v = cfg["qk_nope_head_dim"] + rope_dim, cfg["v_head_dim"]
    if split:       # multi-query over the latent row, the per-head sizes apart
        w.add_uint32(key(attention.HEAD_COUNT_KV), 1)
        w.add_uint32(key(attention.KEY_LENGTH), rank + rope_dim)
        w.add_uint32(key(attention.VALUE_LENGTH), rank)
        w.add_uint32(key(attention.KEY_LENGTH_MLA), qk)
        w.add_uint32(key(attention.VALUE_LENGTH_MLA), v)
    else:
        w.add_uint32(key(attention.KEY_LENGTH), qk)
        w.add_uint32(key(attention.VALUE_LENGTH), v)
    if cfg.get("q_lora_rank"):
        w.add_uint32(key(attention.Q_LORA_RANK), cfg["q_lora_rank"])
    w.add_uint32(key(attention.KV_LORA_RANK), rank)
    w.add_uint32(key(rope.DIMENSION_COUNT), rope_dim)
    w.add_uint32(key(llm.LEADING_DENSE_BLOCK_COUNT), cfg.get("first_k_dense_replace") or 0)
    w.add_uint32(key(llm.EXPERT_COUNT), cfg["n_routed_experts"])
    w.add_uint32(key(llm.EXPERT_USED_COUNT), cfg["num_experts_per_tok"])
    w.add_uint32(key(llm.EXPERT_FEED_FORWARD_LENGTH), cfg["moe_intermediate_size"])
    w.add_uint32(key(llm.EXPERT_SHARED_COUNT), cfg.get("n_shared_experts") or 0)
    w.add_float32(key(llm.EXPERT_WEIGHTS_SCALE), cfg.get("routed_scaling_factor", 1.0))
    if cfg.get("norm_topk_prob"):
        w.add_bool(key(llm.EXPERT_WEIGHTS_NORM), True)
    sigmoid = cfg["model_type"] == "deepseek_v3"
    w.add_uint32(key(llm.EXPERT_GATING_FUNC), 2 if sigmoid else 1)
    if sigmoid and (cfg.get("n_group") or 1) > 1:
        w.add_uint32(key(llm.EXPERT_GROUP_COUNT), cfg["n_group"])
        w.add_uint32(key(llm.EXPERT_GROUP_USED_COUNT), cfg["topk_group"])
    scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if scaling.get("rope_type") == "yarn":
        w.add_string(key(rope.SCALING_TYPE), "yarn")
        w.add_float32(key(rope.SCALING_FACTOR), scaling["factor"])
        w.add_uint32(key(rope.SCALING_ORIG_CTX_LEN), scaling["original_max_position_embeddings"])
        w.add_float32(key(rope.SCALING_YARN_LOG_MUL), 0.1 * scaling["mscale_all_dim"])


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


def dequantized_twin(directory: str, twin: str, qtype: str, split: bool = True) -> None:
    """Copy the checkpoint in ``directory`` to ``twin`` with every weight ``write_gguf(..., qtype, split=split)``
    quantizes replaced by its dequantized blocks: loading ``twin`` and that GGUF file must give the same bits (a
    split kv_b_proj: its W_UK half quantized along the transposed rows llama.cpp stores)."""
    import gguf
    from safetensors.numpy import load_file, save_file
    shutil.copytree(directory, twin)
    cfg = _config(directory)
    kind = gguf.GGMLQuantizationType[qtype]
    block = gguf.GGML_QUANT_SIZES[kind][0]

    def rounded(value: np.ndarray) -> np.ndarray:
        if value.shape[-1] % block:
            return value
        return gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(value, np.float32), kind), kind)
    file = os.path.join(twin, "model.safetensors")
    state = load_file(file)
    for name, value in state.items():
        if name.endswith("self_attn.kv_b_proj.weight") and split:
            k_b, v_b = split_kv_b(value.astype(np.float32), cfg)
            state[name] = np.concatenate([rounded(k_b).transpose(0, 2, 1), rounded(v_b)], axis=1) \
                .reshape(value.shape)
        elif value.ndim == 2 and not name.endswith((".gate.weight", "shared_expert_gate.weight")):
            state[name] = rounded(value)
    save_file(state, file, metadata={"format": "pt"})


def load_f32(path: str):
    """A checkpoint (directory or .gguf) loaded in float32 on the CPU."""
    return load_model(ModelConfig(model=path, dtype="float32"))


def assert_decodes_alike(ours, reference, steps: int, label: str) -> None:
    """Two loaded models give the same greedy tokens and logits, bit for bit, over ``steps`` paged decode steps."""
    tokens, logits = PagedRunner(ours.model, block_size=4, num_blocks=40).greedy(prompt(), steps)
    want_tokens, want = PagedRunner(reference.model, block_size=4, num_blocks=40).greedy(prompt(), steps)
    assert tokens == want_tokens, f"{label}: {tokens} != {want_tokens}"
    assert torch.equal(logits, want), f"{label}: worst relative error {relative_error(logits, want)}"


def assert_equals_dequantized_twin(directory: str, gguf_path: str, twin: str, qtype: str, steps: int, label: str):
    """The ``qtype`` file written from ``directory`` decodes as its dequantized twin (written to ``twin``); returns
    the file's loaded model."""
    dequantized_twin(directory, twin, qtype)
    ours = load_f32(gguf_path)
    assert_decodes_alike(ours, load_f32(twin), steps, label)
    return ours
