"""Architecture hyper-parameters, parsed once from an HF ``config.json`` dict or GGUF metadata."""
from __future__ import annotations

from dataclasses import dataclass, field

from gh200rt.models.deepseek_config import (deepseek2_config_from_gguf, deepseek2_rope_from_gguf, deepseek_fields,
                                            glm4_moe_fields)

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v2",
                           "deepseek_v3", "glm4_moe")
MOE_ARCHITECTURES = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3", "glm4_moe")
# GGUF files name architectures their own way: general.architecture -> ours (a ``llama`` file with experts is
# Mixtral, see ``_moe_from_gguf``)
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                      "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "deepseek2": "deepseek_v3"}
# llama.cpp's routing per GGUF architecture: whether the top-k weights are renormalised (its graphs fix this per
# architecture, whatever the original norm_topk_prob was) and whether they are applied in float32
_GGUF_ROUTING = {"qwen2moe": (False, False), "qwen3moe": (True, False), "llama": (True, True)}
_GGUF_SOFTMAX_GATING = 1
_ROPE_TYPES = (None, "default", "linear", "llama3", "yarn")


def _unsupported(name) -> ValueError:
    return ValueError(f"unsupported architecture {name!r}; gh200rt supports: {', '.join(SUPPORTED_ARCHITECTURES)}")


def _rope_from_hf(cfg: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either the classic keys or transformers-5 ``rope_parameters``."""
    params = cfg.get("rope_parameters")
    theta = cfg.get("rope_theta")
    scaling = cfg.get("rope_scaling")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        if scaling is None and params.get("rope_type", "default") != "default":
            scaling = params
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in (None, "default"):
            scaling = None
        elif kind not in _ROPE_TYPES:
            raise ValueError(f"rope scaling type {kind!r} is not supported; supported: linear, llama3, yarn")
        else:
            scaling = {k: v for k, v in scaling.items() if k != "rope_theta"} | {"rope_type": kind}
    return float(theta if theta is not None else 10000.0), scaling


def _moe_from_hf(model_type: str, cfg: dict) -> dict:
    """The MoE fields of ``cfg`` for an MoE family (KeyError names a required one that is absent)."""
    if model_type not in MOE_ARCHITECTURES:
        return {}
    if model_type == "mixtral":  # every layer sparse, experts as wide as intermediate_size, softmax over the top k
        return dict(num_experts=int(cfg["num_local_experts"]), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                    moe_intermediate_size=int(cfg["intermediate_size"]), norm_topk_prob=True,
                    routing_weights_fp32=True)
    # transformers 5 writes Qwen3-MoE's expert count as num_local_experts; published configs say num_experts
    experts = cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"]
    return dict(num_experts=int(experts), num_experts_per_tok=int(cfg["num_experts_per_tok"]),
                moe_intermediate_size=int(cfg["moe_intermediate_size"]),
                shared_expert_intermediate_size=int(cfg["shared_expert_intermediate_size"])
                if model_type == "qwen2_moe" else 0,
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                decoder_sparse_step=int(cfg.get("decoder_sparse_step", 1)),
                mlp_only_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()))


def _moe_from_gguf(arch: str, meta: dict, get) -> dict:
    """The MoE fields of a GGUF file's metadata (``{arch}.expert_count`` ...; empty for a dense file). Every block
    of a GGUF MoE file is sparse (llama.cpp has no dense-layer list for these architectures)."""
    experts = int(meta.get(f"{arch}.expert_count") or 0)
    if not experts:
        if arch in ("qwen2moe", "qwen3moe"):
            raise ValueError(f"GGUF metadata lacks {arch}.expert_count")
        return {}
    if arch not in _GGUF_ROUTING:
        raise ValueError(f"GGUF architecture {arch!r} with experts is not supported; gh200rt reads MoE files of "
                         f"architectures {', '.join(_GGUF_ROUTING)}")
    gating = meta.get(f"{arch}.expert_gating_func")
    if gating not in (None, _GGUF_SOFTMAX_GATING):
        raise ValueError(f"{arch}.expert_gating_func {gating} is not supported; gh200rt routes with a softmax (1)")
    scale = float(meta.get(f"{arch}.expert_weights_scale") or 1.0)
    if scale != 1.0:
        raise ValueError(f"{arch}.expert_weights_scale {scale} is not supported; gh200rt scales routing weights by 1")
    used = int(get("expert_used_count"))
    width = meta.get(f"{arch}.expert_feed_forward_length")
    if width is None:   # llama.cpp's fallback for a file without it; Mixtral's experts are feed_forward_length wide
        width = int(get("feed_forward_length")) if arch == "llama" else int(get("feed_forward_length")) // used
    renormalize, fp32 = _GGUF_ROUTING[arch]
    shared = int(meta.get(f"{arch}.expert_shared_feed_forward_length") or get("feed_forward_length")) \
        if arch == "qwen2moe" else 0
    return dict(num_experts=experts, num_experts_per_tok=used, moe_intermediate_size=int(width),
                shared_expert_intermediate_size=shared, norm_topk_prob=renormalize, routing_weights_fp32=fp32)


@dataclass(frozen=True)
class ArchConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    checkpoint_dtype: str = "float32"
    # mixture of experts (0 experts: a dense model); see models/moe.py
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0              # one routed expert's intermediate size
    shared_expert_intermediate_size: int = 0    # Qwen2-MoE's always-on expert (0: none)
    norm_topk_prob: bool = False                # renormalise the top-k softmax probabilities to sum to 1
    decoder_sparse_step: int = 1                # layer i is sparse when (i + 1) % step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()       # ... and i is not listed here
    routing_weights_fp32: bool = False          # scale expert outputs in float32 (Mixtral) or the hidden dtype
    # DeepSeekMoE routing (models/layers/moe_experts.py: route_grouped): sigmoid scores, a per-expert correction bias
    # for the choice, the best topk_group of n_group expert groups, weights times routed_scaling_factor
    scoring_func: str = "softmax"
    topk_method: str = "greedy"                 # greedy | group_limited_greedy (V2: groups by their best) | noaux_tc
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    # multi-head latent attention (DeepSeek-V3; kv_lora_rank 0: none; models/layers/mla.py). head_dim is the rotary
    # part of a query/key head (qk_rope_head_dim), as transformers has it
    q_lora_rank: int = 0                        # 0: one q_proj instead of q_a_proj / q_a_layernorm / q_b_proj
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False               # rotary pairs stored interleaved (x0, x1), (x2, x3) ...
    num_nextn_predict_layers: int = 0           # multi-token-prediction layers a checkpoint ships (not run yet)
    rotary_dim: int = 0                         # RoPE over the first rotary_dim of each head (GLM-4.5); 0: all

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise _unsupported(self.architecture)
        if self.num_experts:
            if not 0 < self.num_experts_per_tok <= self.num_experts:
                raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} must be in 1..num_experts "
                                 f"({self.num_experts})")
            if self.moe_intermediate_size <= 0 or self.decoder_sparse_step < 1:
                raise ValueError(f"moe_intermediate_size {self.moe_intermediate_size} must be positive and "
                                 f"decoder_sparse_step {self.decoder_sparse_step} at least 1")
            outside = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
            if outside:
                raise ValueError(f"mlp_only_layers {outside} are not layers of a {self.num_layers}-layer model")
        elif self.architecture in MOE_ARCHITECTURES:
            raise ValueError(f"{self.architecture} needs num_experts > 0")
        if self.topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise ValueError(f"topk_method {self.topk_method!r} is not supported; gh200rt chooses experts by greedy, "
                             "group_limited_greedy or noaux_tc")
        if self.scoring_func not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring_func {self.scoring_func!r} is not supported; gh200rt routes with softmax or "
                             "sigmoid scores")
        if self.num_experts and (self.n_group < 1 or self.num_experts % self.n_group
                                 or not 1 <= self.topk_group <= self.n_group
                                 or self.num_experts_per_tok > self.topk_group * self.num_experts // self.n_group):
            raise ValueError(f"n_group {self.n_group} / topk_group {self.topk_group} do not fit {self.num_experts} "
                             f"experts and {self.num_experts_per_tok} per token: n_group must divide the experts, "
                             "topk_group be in 1..n_group and its groups hold num_experts_per_tok experts")
        if self.kv_lora_rank and (self.qk_nope_head_dim <= 0 or self.v_head_dim <= 0 or self.head_dim % 2):
            raise ValueError(f"latent attention needs positive qk_nope_head_dim ({self.qk_nope_head_dim}) and "
                             f"v_head_dim ({self.v_head_dim}) and an even qk_rope_head_dim ({self.head_dim})")
        if self.rotary_dim and (self.rotary_dim % 2 or self.rotary_dim > self.head_dim):
            raise ValueError(f"rotary_dim {self.rotary_dim} must be even and at most head_dim {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads {self.num_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_kv_heads}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rope_dim(self) -> int:
        """Dimensions of a query/key head that RoPE rotates."""
        return self.rotary_dim or self.head_dim

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_planes(self) -> int:
        """Planes of a layer's paged KV pool: K and V, or one for latent attention (its keys are its values)."""
        return 1 if self.is_mla else 2

    @property
    def kv_cache_heads(self) -> int:
        return 1 if self.is_mla else self.num_kv_heads

    @property
    def kv_cache_dim(self) -> int:
        """Values per token and head in the KV pool: a head, or the latent and the rotary key (576 for DeepSeek-V3)."""
        return self.kv_lora_rank + self.head_dim if self.is_mla else self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` routes its tokens to experts (transformers' rule)."""
        return self.num_experts > 0 and layer not in self.mlp_only_layers \
            and (layer + 1) % self.decoder_sparse_step == 0

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ArchConfig":
        model_type = cfg.get("model_type")
        if model_type is None:
            archs = cfg.get("architectures") or []
            model_type = archs[0] if archs else None
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise _unsupported(model_type)
        if model_type in ("deepseek_v2", "deepseek_v3", "glm4_moe"):
            theta, scaling = _rope_from_hf(cfg)
            fields = glm4_moe_fields if model_type == "glm4_moe" else deepseek_fields
            return cls(**fields({**cfg, "model_type": model_type}, theta, scaling))
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        theta, scaling = _rope_from_hf(cfg)
        dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        max_positions = int(cfg.get("max_position_embeddings", 2048))
        window = cfg.get("sliding_window")
        if window and (model_type in ("mistral", "mixtral") or cfg.get("use_sliding_window")):
            # sliding-window attention is not implemented; within the window it equals full attention
            max_positions = min(max_positions, int(window))
        return cls(
            architecture=model_type, hidden_size=hidden, intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads), vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=max_positions, tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("qkv_bias", True)) if model_type == "qwen2_moe"
            else bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type in ("qwen3", "qwen3_moe"), checkpoint_dtype=str(dtype),
            **_moe_from_hf(model_type, cfg))

    @classmethod
    def from_gguf_metadata(cls, meta: dict, vocab_size: int | None = None,
                           tie_word_embeddings: bool = False) -> "ArchConfig":
        """``meta`` maps GGUF keys (``llama.block_count`` ...) to Python values."""
        arch = meta.get("general.architecture")
        if arch not in GGUF_ARCHITECTURES:
            raise ValueError(f"unsupported GGUF architecture {arch!r}; gh200rt supports: "
                             f"{', '.join(GGUF_ARCHITECTURES)}")

        def get(key, default=None):
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ValueError(f"GGUF metadata lacks {arch}.{key}")
            return value

        hidden = int(get("embedding_length"))
        heads = int(get("attention.head_count"))
        kv_heads = int(get("attention.head_count_kv", heads))
        head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
        if vocab_size is None:
            vocab_size = int(meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"]))
        if arch == "deepseek2":    # DeepSeek-V2 / V3 / R1, Kimi-K2: latent attention, DeepSeekMoE
            cfg = deepseek2_config_from_gguf(meta, int(vocab_size), tie_word_embeddings)
            theta, scaling = deepseek2_rope_from_gguf(meta)
            return cls(**{**deepseek_fields(cfg, theta, scaling), "checkpoint_dtype": "gguf"})
        scaling = None
        kind = meta.get(f"{arch}.rope.scaling.type")
        if kind == "linear":
            scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
        elif kind not in (None, "none"):
            raise ValueError(f"GGUF rope scaling type {kind!r} is not supported; supported: linear")
        moe = _moe_from_gguf(arch, meta, get)
        architecture = "mixtral" if moe and arch == "llama" else GGUF_ARCHITECTURES[arch]
        # a Qwen MoE file may leave out feed_forward_length: every layer is sparse, so the dense width is unused
        dense_width = meta.get(f"{arch}.feed_forward_length") or moe.get("moe_intermediate_size") \
            or get("feed_forward_length")
        return cls(
            architecture=architecture, hidden_size=hidden, intermediate_size=int(dense_width),
            num_layers=int(get("block_count")), num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            vocab_size=int(vocab_size), rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(get("rope.freq_base", 10000.0)), rope_scaling=scaling,
            max_position_embeddings=int(get("context_length", 2048)), tie_word_embeddings=tie_word_embeddings,
            attention_bias=arch in ("qwen2", "qwen2moe"), qk_norm=arch in ("qwen3", "qwen3moe"),
            checkpoint_dtype="gguf", **moe)
