"""The ``ArchConfig`` fields of a DeepSeek-V3 ``config.json`` (also Kimi-K2's, which is the same architecture), of a
GGUF ``deepseek2`` file's metadata, and of GLM-4.5's (``glm4_moe``), whose MoE blocks are DeepSeek-V3's under GQA
attention with partial RoPE.

DeepSeek names its fields its own way (``n_routed_experts``, ``first_k_dense_replace``, ``kv_lora_rank`` ...); this
maps them onto gh200rt's, and refuses what the model code does not compute (another scoring function or top-k
method) with the value it found and what it supports.
"""
from __future__ import annotations

# DeepSeek-V3's router: sigmoid scores, a correction bias that steers the choice only ("noaux_tc", auxiliary-loss-free
# balancing), the best topk_group of n_group expert groups by the sum of each group's two best scores
SCORING_FUNCS = ("sigmoid",)
TOPK_METHODS = (None, "noaux_tc")
# DeepSeek-V2's: softmax scores, the top k of all experts ("greedy") or of the topk_group groups whose best expert
# scores highest ("group_limited_greedy")
V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


def _deepseek_moe(cfg: dict, architecture: str) -> dict:
    """The DeepSeekMoE fields: routed and shared experts, dense first layers, the grouped router (V3's sigmoid one,
    or V2's softmax one)."""
    if architecture == "deepseek_v2":
        scoring, method = cfg.get("scoring_func", "softmax"), cfg.get("topk_method") or "greedy"
        if scoring != "softmax" or method not in V2_TOPK_METHODS:
            raise ValueError(f"scoring_func {scoring!r} with topk_method {method!r} is not supported for deepseek_v2; "
                             f"gh200rt routes its experts with softmax scores, topk_method "
                             f"{' or '.join(V2_TOPK_METHODS)}")
    else:
        scoring, method = cfg.get("scoring_func", "sigmoid"), cfg.get("topk_method")
        if scoring not in SCORING_FUNCS:
            raise ValueError(f"scoring_func {scoring!r} is not supported for {architecture}; gh200rt routes its "
                             f"experts with {', '.join(SCORING_FUNCS)} scores, as the published checkpoints do")
        if method not in TOPK_METHODS:
            raise ValueError(f"topk_method {method!r} is not supported for {architecture}; gh200rt chooses experts "
                             "by noaux_tc (sigmoid scores plus e_score_correction_bias, group-limited)")
        method = "noaux_tc"
    layers = int(cfg["num_hidden_layers"])
    width = int(cfg["moe_intermediate_size"])
    dense_first = int(cfg.get("first_k_dense_replace") or 0)
    every = int(cfg.get("moe_layer_freq") or 1)
    return dict(
        num_experts=int(cfg["n_routed_experts"]), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_intermediate_size=width, shared_expert_intermediate_size=int(cfg.get("n_shared_experts") or 0) * width,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", architecture != "deepseek_v2")), routing_weights_fp32=True,
        topk_method=method,
        mlp_only_layers=tuple(i for i in range(layers) if i < dense_first or i % every),
        scoring_func=scoring, n_group=int(cfg.get("n_group") or 1), topk_group=int(cfg.get("topk_group") or 1),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
        num_nextn_predict_layers=int(cfg.get("num_nextn_predict_layers") or 0))


def _common(cfg: dict, architecture: str, rope_theta: float, rope_scaling: dict | None) -> dict:
    return dict(
        architecture=architecture, hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]), num_layers=int(cfg["num_hidden_layers"]),
        num_heads=int(cfg["num_attention_heads"]), vocab_size=int(cfg["vocab_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=rope_theta, rope_scaling=rope_scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        checkpoint_dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"))


def deepseek_fields(cfg: dict, rope_theta: float, rope_scaling: dict | None) -> dict:
    """``ArchConfig`` keyword arguments for a ``deepseek_v3`` or ``deepseek_v2`` config (KeyError names a required
    field): the same latent attention (V2's rotary pairs always interleaved), V2's softmax router."""
    architecture = cfg["model_type"]
    heads = int(cfg["num_attention_heads"])
    q_lora = cfg.get("q_lora_rank")
    return dict(
        **_common(cfg, architecture, rope_theta, rope_scaling), **_deepseek_moe(cfg, architecture),
        num_kv_heads=heads, head_dim=int(cfg["qk_rope_head_dim"]),
        q_lora_rank=int(q_lora or 0), kv_lora_rank=int(cfg["kv_lora_rank"]),
        qk_nope_head_dim=int(cfg["qk_nope_head_dim"]), v_head_dim=int(cfg["v_head_dim"]),
        rope_interleave=bool(cfg.get("rope_interleave", True)) or architecture == "deepseek_v2")


def glm4_moe_fields(cfg: dict, rope_theta: float, rope_scaling: dict | None) -> dict:
    """``ArchConfig`` keyword arguments for a ``glm4_moe`` config (GLM-4.5 / 4.6): GQA attention with q/k/v bias, the
    optional per-head q/k RMSNorm (``use_qk_norm``), RoPE over the first ``partial_rotary_factor`` of each head."""
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    factor = float(cfg.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)))
    rotary = int(head_dim * factor)
    if rotary % 2 or not 0 < rotary <= head_dim:
        raise ValueError(f"partial_rotary_factor {factor} of head_dim {head_dim} gives {rotary} rotary dimensions; "
                         "gh200rt needs an even number from 2 to head_dim")
    return dict(
        **_common(cfg, "glm4_moe", rope_theta, rope_scaling), **_deepseek_moe(cfg, "glm4_moe"),
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
        qk_norm=bool(cfg.get("use_qk_norm", False)), rotary_dim=0 if rotary == head_dim else rotary)


# llama.cpp's expert_gating_func values
_GGUF_GATING = {1: "softmax", 2: "sigmoid"}


def deepseek2_config_from_gguf(meta: dict, vocab_size: int, tie_word_embeddings: bool) -> dict:
    """A ``config.json``-like dict (``deepseek_fields`` reads it) from a GGUF ``deepseek2`` file's metadata, as
    llama.cpp's converter writes it for DeepSeek-V2 / V3 / R1 and Kimi-K2: a sigmoid router makes it ``deepseek_v3``,
    a softmax one ``deepseek_v2``. Newer files describe the latent attention as multi-query (``key_length`` =
    kv_lora_rank + rope, ``key_length_mla`` / ``value_length_mla`` the per-head sizes), older ones give the per-head
    sizes in ``key_length`` / ``value_length``. Multi-token-prediction blocks (``nextn_predict_layers``) count in
    ``block_count``."""
    def get(key, default=None):
        value = meta.get(f"deepseek2.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks deepseek2.{key}")
        return value
    gating = int(get("expert_gating_func", 1))
    if gating not in _GGUF_GATING:
        raise ValueError(f"deepseek2.expert_gating_func {gating} is not supported; gh200rt routes DeepSeek experts "
                         f"with softmax (1) or sigmoid (2) scores")
    rope = int(get("rope.dimension_count"))
    key, value = meta.get("deepseek2.attention.key_length_mla"), meta.get("deepseek2.attention.value_length_mla")
    if key is None:
        key, value = get("attention.key_length"), get("attention.value_length")
    nextn = int(get("nextn_predict_layers", 0))
    groups = int(get("expert_group_count", 1))
    cfg = dict(
        model_type="deepseek_v3" if _GGUF_GATING[gating] == "sigmoid" else "deepseek_v2",
        hidden_size=int(get("embedding_length")), intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")) - nextn, num_nextn_predict_layers=nextn,
        num_attention_heads=int(get("attention.head_count")), vocab_size=vocab_size,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(get("context_length", 4096)), tie_word_embeddings=tie_word_embeddings,
        q_lora_rank=meta.get("deepseek2.attention.q_lora_rank"), kv_lora_rank=int(get("attention.kv_lora_rank")),
        qk_rope_head_dim=rope, qk_nope_head_dim=int(key) - rope, v_head_dim=int(value), rope_interleave=True,
        n_routed_experts=int(get("expert_count")), num_experts_per_tok=int(get("expert_used_count")),
        moe_intermediate_size=int(get("expert_feed_forward_length")),
        n_shared_experts=int(get("expert_shared_count", 0)),
        first_k_dense_replace=int(get("leading_dense_block_count", 0)),
        norm_topk_prob=bool(get("expert_weights_norm", False)),
        routed_scaling_factor=float(get("expert_weights_scale", 1.0)),
        n_group=groups, topk_group=int(get("expert_group_used_count", 1)),
        scoring_func=_GGUF_GATING[gating],
        topk_method=None if gating == 2 else "group_limited_greedy" if groups > 1 else "greedy")
    return cfg


def deepseek2_rope_from_gguf(meta: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) of a ``deepseek2`` file. llama.cpp keeps one YaRN figure for the attention scale,
    ``yarn_log_multiplier`` = 0.1 x mscale_all_dim, and leaves the cos/sin tables unscaled (mscale = mscale_all_dim,
    as DeepSeek's configs have it): that is what this computes."""
    theta = float(meta.get("deepseek2.rope.freq_base", 10000.0))
    kind = meta.get("deepseek2.rope.scaling.type")
    if kind in (None, "none"):
        return theta, None
    if kind != "yarn":
        raise ValueError(f"GGUF rope scaling type {kind!r} is not supported for deepseek2; supported: yarn")
    attn = float(meta.get("deepseek2.rope.scaling.attn_factor") or 1.0)
    if attn != 1.0:
        raise ValueError(f"deepseek2.rope.scaling.attn_factor {attn} is not supported; gh200rt computes DeepSeek's "
                         "YaRN with attn_factor 1 (its scale comes from rope.scaling.yarn_log_multiplier)")
    mscale_all = float(meta.get("deepseek2.rope.scaling.yarn_log_multiplier") or 0.0) / 0.1
    needed = {key: meta.get(f"deepseek2.rope.scaling.{key}") for key in ("factor", "original_context_length")}
    for key, found in needed.items():
        if found is None:
            raise ValueError(f"GGUF metadata lacks deepseek2.rope.scaling.{key} (YaRN scaling needs it)")
    return theta, {"rope_type": "yarn", "factor": float(needed["factor"]),
                   "original_max_position_embeddings": int(needed["original_context_length"]),
                   "beta_fast": float(meta.get("deepseek2.rope.scaling.yarn_beta_fast") or 32.0),
                   "beta_slow": float(meta.get("deepseek2.rope.scaling.yarn_beta_slow") or 1.0),
                   "mscale": mscale_all, "mscale_all_dim": mscale_all, "attention_factor": 1.0}
