"""Model directories of a known shape with random bf16 weights, generated here (``--random-model SHAPE``).

For decode benchmarks of a real model size on a host that cannot download one: the shape is exact (so
bytes moved, FLOPs and the planner's choices are those of the real model); the values are random, so
the generated text is noise. Weights are slices of one seeded normal(0, 0.02) pool at random offsets
(norms near 1), which keeps writing 16 GB fast and deterministic.

Benchmarks take it as ``--random-model SHAPE [--random-model-dir DIR]`` (``add_random_model_arguments``,
``model_of``): ``latency``, ``tiers`` and scripts/serve_smoke.py; scripts/random_checkpoint.py writes one from
the command line.

The directory holds config.json, one safetensors shard per decoder layer (plus one for embeddings and
head) with model.safetensors.index.json, and a word-level tokenizer. An existing directory whose
``random_checkpoint.json`` stamp names the same shape is reused as is.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

import torch

# transformers config fields; llama3-8b is Meta-Llama-3-8B's config.json (shape fields only), qwen3-30b-a3b
# Qwen/Qwen3-30B-A3B's and mixtral-8x7b mistralai/Mixtral-8x7B-v0.1's (a "model_type" other than llama says which
# family's names and config fields the directory gets).
_QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                      num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                      max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, num_experts=128,
                      num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[])
# deepseek-ai/DeepSeek-V3's config.json (shape fields; YaRN as published)
_DEEPSEEK_V3 = dict(model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
                    num_attention_heads=128, num_key_value_heads=128, vocab_size=129280, max_position_embeddings=163840,
                    rope_theta=10000.0, rms_norm_eps=1e-6, moe_intermediate_size=2048, n_routed_experts=256,
                    n_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4, first_k_dense_replace=3,
                    routed_scaling_factor=2.5, norm_topk_prob=True, scoring_func="sigmoid", topk_method="noaux_tc",
                    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0),
    # the same family at a size CI can write and load in a second
    "llama3-tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                        num_key_value_heads=2, vocab_size=1024, max_position_embeddings=2048, rope_theta=500000.0),
    # 61 GB of bf16 (1.25 GB a layer); the 8-layer cut (11 GB) has the real layer, vocabulary and head
    "qwen3-30b-a3b": _QWEN3_30B_A3B,
    "qwen3-30b-a3b-8l": dict(_QWEN3_30B_A3B, num_hidden_layers=8),
    # 93 GB of bf16 (2.9 GB a layer): write a cut of it with --num-layers
    "mixtral-8x7b": dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                         max_position_embeddings=32768, rope_theta=1000000.0, num_local_experts=8,
                         num_experts_per_tok=2, sliding_window=None),
    # DeepSeek-V3's layers exactly (latent attention, a dense first layer, experts of V3's width, its vocabulary) cut
    # to two layers and 16 routed experts: 7 GB of bf16 where one of V3's MoE layers alone is 23 GB
    "deepseek-v3-cut": dict(_DEEPSEEK_V3, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=16,
                            n_group=4, topk_group=2),
    # DeepSeek-V3's layout at a size CI can write and load in a second
    "deepseek-v3-tiny": dict(_DEEPSEEK_V3, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=4, vocab_size=1024,
                             max_position_embeddings=2048, moe_intermediate_size=64, n_routed_experts=16,
                             n_group=4, topk_group=2, first_k_dense_replace=1, kv_lora_rank=64, q_lora_rank=96,
                             qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, rope_scaling=None),
    # Qwen3-MoE's layout at a size CI can write and load in a second
    "qwen3-moe-tiny": dict(_QWEN3_30B_A3B, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1024,
                           max_position_embeddings=2048, num_experts=16, num_experts_per_tok=4,
                           moe_intermediate_size=64),
}
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
                  "deepseek_v3": "DeepseekV3ForCausalLM"}
POOL_ELEMENTS = 1 << 26  # at most 128 MiB of bf16: every weight is a slice of it at a random offset
STAMP = "random_checkpoint.json"


def config_of(shape: str, num_layers: int | None = None) -> dict:
    """config.json of ``shape``; ``num_layers`` cuts (or extends) its depth."""
    fields = dict(SHAPES[shape])
    model_type = fields.pop("model_type", "llama")
    if num_layers is not None:
        fields["num_hidden_layers"] = num_layers
    return {"architectures": [_ARCHITECTURES[model_type]], "model_type": model_type, "torch_dtype": "bfloat16",
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, **fields}


def _mlp_shapes(cfg: dict, p: str) -> dict[str, tuple[int, ...]]:
    """The MLP block of one layer: dense, or router and experts under the family's checkpoint names."""
    h = cfg["hidden_size"]
    layer = int(p.split(".")[2])
    if cfg["model_type"] == "deepseek_v3" and layer >= cfg["first_k_dense_replace"]:
        e, i, shared = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["n_shared_experts"]
        shapes = _experts(p + "mlp.", e, i, h, ("gate_proj", "up_proj", "down_proj"))
        s = shared * i
        block = p + "mlp.shared_experts."
        return shapes | {p + "mlp.gate.e_score_correction_bias": (e,), block + "gate_proj.weight": (s, h),
                         block + "up_proj.weight": (s, h), block + "down_proj.weight": (h, s)}
    if cfg["model_type"] == "qwen3_moe":
        e, i = cfg["num_experts"], cfg["moe_intermediate_size"]
        block, names = p + "mlp.", ("gate_proj", "up_proj", "down_proj")
    elif cfg["model_type"] == "mixtral":
        e, i = cfg["num_local_experts"], cfg["intermediate_size"]
        block, names = p + "block_sparse_moe.", ("w1", "w3", "w2")
    else:
        i = cfg["intermediate_size"]
        return {p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i)}
    return _experts(block, e, i, h, names)


def _experts(block: str, e: int, i: int, h: int, names: tuple[str, str, str]) -> dict[str, tuple[int, ...]]:
    shapes = {block + "gate.weight": (e, h)}
    for x in range(e):
        gate, up, down = (f"{block}experts.{x}.{n}.weight" for n in names)
        shapes |= {gate: (i, h), up: (i, h), down: (h, i)}
    return shapes


def _latent_attention_shapes(cfg: dict, p: str) -> dict[str, tuple[int, ...]]:
    h, heads, rank = cfg["hidden_size"], cfg["num_attention_heads"], cfg["kv_lora_rank"]
    rope, nope, v, q_rank = cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["q_lora_rank"]
    a = p + "self_attn."
    return {a + "q_a_proj.weight": (q_rank, h), a + "q_a_layernorm.weight": (q_rank,),
            a + "q_b_proj.weight": (heads * (nope + rope), q_rank),
            a + "kv_a_proj_with_mqa.weight": (rank + rope, h), a + "kv_a_layernorm.weight": (rank,),
            a + "kv_b_proj.weight": (heads * (nope + v), rank),
            a + "o_proj.weight": (h, heads * v)}


def layer_shapes(cfg: dict, layer: int) -> dict[str, tuple[int, ...]]:
    h = cfg["hidden_size"]
    if cfg["model_type"] == "deepseek_v3":
        p = f"model.layers.{layer}."
        return {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)} \
            | _latent_attention_shapes(cfg, p) | _mlp_shapes(cfg, p)
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    p = f"model.layers.{layer}."
    shapes = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
              p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
              p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q)}
    if cfg["model_type"] == "qwen3_moe":
        shapes |= {p + "self_attn.q_norm.weight": (head_dim,), p + "self_attn.k_norm.weight": (head_dim,)}
    return shapes | _mlp_shapes(cfg, p)


class RandomSource:
    def __init__(self, seed: int = 0, pool_elements: int = POOL_ELEMENTS):
        self.gen = torch.Generator().manual_seed(seed)
        self.pool = (torch.randn(pool_elements, generator=self.gen) * 0.02).to(torch.bfloat16)

    def tensor(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return 1.0 + self.tensor("", shape) * 5
        numel = 1
        for n in shape:
            numel *= n
        out = torch.empty(numel, dtype=torch.bfloat16)
        done = 0
        while done < numel:
            start = int(torch.randint(0, len(self.pool) // 2, (1,), generator=self.gen))
            take = min(numel - done, len(self.pool) - start)
            out[done:done + take] = self.pool[start:start + take]
            done += take
        return out.view(shape)


def write_tokenizer(path: str, vocab_size: int) -> None:
    """A byte-level BPE tokenizer "<unk> <s> </s>", the 256 bytes, then fillers "w{i}" up to ``vocab_size``.

    Every text encodes (byte by byte) and every token decodes to bytes, so the server's structured outputs
    (a grammar needs to know each token's bytes) work on a random model as on a real one; the fillers are
    ids a decode benchmark reaches, and decode to their own letters."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    if vocab_size < len(vocab):
        raise ValueError(f"a vocabulary of {vocab_size} cannot hold the 3 specials and 256 bytes")
    vocab |= {f"w{i}": i for i in range(len(vocab), vocab_size)}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f)


def write_random_checkpoint(shape: str, path: str, seed: int = 0, num_layers: int | None = None) -> str:
    """Write (or reuse) the directory; returns ``path``. ``num_layers``: the shape cut to that many layers."""
    from safetensors.torch import save_file
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if num_layers is not None and num_layers < 1:
        raise ValueError(f"num_layers {num_layers} must be at least 1")
    cfg = config_of(shape, num_layers)
    stamp = {"shape": shape, "seed": seed, **SHAPES[shape], **({"num_layers": num_layers} if num_layers else {})}
    stamp_path = os.path.join(path, STAMP)
    if os.path.isfile(stamp_path):
        with open(stamp_path) as f:
            if json.load(f) == stamp:
                write_tokenizer(path, cfg["vocab_size"])
                return path     # the weights are reused; the tokenizer is rewritten (cheap, and it changed once)
    os.makedirs(path, exist_ok=True)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    source = RandomSource(seed, min(POOL_ELEMENTS, 2 * max(vocab * h, cfg["intermediate_size"] * h)))
    shards = {"model-outer.safetensors": {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
                                          "lm_head.weight": (vocab, h)}}
    shards |= {f"model-layer{i:03d}.safetensors": layer_shapes(cfg, i) for i in range(cfg["num_hidden_layers"])}
    weight_map = {}
    for filename, shapes in shards.items():
        save_file({name: source.tensor(name, s) for name, s in shapes.items()}, os.path.join(path, filename))
        weight_map |= {name: filename for name in shapes}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_tokenizer(path, vocab)
    with open(stamp_path, "w") as f:  # last: a directory without it is incomplete and is rewritten
        json.dump(stamp, f)
    return path


def add_random_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--random-model", choices=list(SHAPES),
                        help="run a model of this shape with random weights written here (overrides --model)")
    parser.add_argument("--random-model-dir", help="where --random-model writes (or finds) its directory "
                                                   "(default: a temporary directory, removed afterwards)")
    parser.add_argument("--random-model-layers", type=int, default=None,
                        help="cut --random-model to this many decoder layers (e.g. mixtral-8x7b to fit the disk)")


@contextlib.contextmanager
def model_of(args: argparse.Namespace):
    """``args.model``, or the ``--random-model`` checkpoint written (or reused) for the duration of the block."""
    with tempfile.TemporaryDirectory(prefix="gh200rt-random-") as scratch:
        if not args.random_model:
            yield args.model
            return
        start = time.perf_counter()
        path = write_random_checkpoint(args.random_model, args.random_model_dir or scratch,
                                       num_layers=args.random_model_layers)
        print(f"random {args.random_model} weights in {path} ({time.perf_counter() - start:.1f} s)", flush=True)
        yield path
