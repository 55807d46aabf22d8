"""LoRA on DeepSeek-V2 / V3 (latent attention, dense first layers, routed experts): gh200rt's engine (float32, CPU)
against transformers with the adapter merged into its weights, for the base model and two adapters in one batch, on
V3's shape (q through q_a_proj / q_b_proj) and on one with a single q_proj. One adapter covers every linear an
adapter may take (attention's five and the dense layer's MLP); the other only kv_b_proj, whose delta the engine
takes through the absorbed products (gh200rt/lora/absorbed.py) rather than through the linear. Adapters on experts
are refused; a tensor-parallel rank's slice of a latent-attention adapter rebuilds the full delta."""
from __future__ import annotations

import pytest
import torch

from gh200rt import LLM, SamplingParams
from gh200rt.distributed.sharding import TensorShard
from gh200rt.lora.peft_adapter import LoraAdapterError, read_peft_adapter, target_shapes
from gh200rt.lora.request import LoRARequest
from gh200rt.lora.tp_shard import COLUMN_PARALLEL, REPLICATED, _column_range, _row_ranges, shard_adapter
from gh200rt.models.arch_config import ArchConfig
from tests.engine.route_engines import describe_difference, sampled_logits
from tests.lora.peft_files import LATENT, MLP, merged_model, write_peft_adapter
from tests.lora.test_lora_parity import hf_greedy, tokens_and_logprobs
from tests.model.tiny_checkpoints import save_tiny

STEPS = 8
PROMPTS = {"base": [5, 9, 17, 33, 4, 71, 8, 100, 12, 6, 44], "full": [7, 7, 19, 203, 40, 8, 3],
           "kv": [90, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]}
GREEDY = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=0)


def latent_names(hf) -> tuple[str, ...]:
    return LATENT if hf.config.q_lora_rank else ("q_proj", *LATENT[2:])


@pytest.fixture(scope="module", params=["deepseek-v3", "deepseek-v3-plain-q"])
def tiny(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-deepseek")
    hf = save_tiny(request.param, str(root / "model"))
    attention = latent_names(hf)
    full = write_peft_adapter(str(root / "full"), hf, r=4, alpha=8, targets=(*attention, *MLP), seed=1,
                              layer_targets=lambda layer: attention + (MLP if layer == 0 else ()))
    kv = write_peft_adapter(str(root / "kv"), hf, r=8, alpha=16, targets=("kv_b_proj",), seed=2, use_rslora=True)
    return {"path": str(root / "model"), "hf": hf, "full": full, "kv": kv, "root": root}


def test_two_adapters_and_the_base_in_one_batch_match_merged_transformers(tiny):
    llm = LLM(model=tiny["path"], dtype="float32", max_model_len=128, num_kv_blocks=96, block_size=4,
              enable_lora=True, lora_modules=(f"full={tiny['full']}", f"kv={tiny['kv']}"), max_loras=2,
              max_lora_rank=8)
    names = list(PROMPTS)
    outs = llm.generate([PROMPTS[n] for n in names], GREEDY,
                        lora_request=[None if n == "base" else LoRARequest(n, i) for i, n in enumerate(names)])
    for name, out in zip(names, outs):
        reference = tiny["hf"] if name == "base" else merged_model(tiny["hf"], tiny[name])
        ours, our_lp = tokens_and_logprobs(out)
        want, want_lp = hf_greedy(reference, PROMPTS[name])
        worst = max(abs(a - b) for a, b in zip(our_lp, want_lp))
        print(f"{name}: tokens {ours} (transformers {want}); worst logprob gap {worst:.2e}")
        assert ours == want, f"{name}: greedy tokens differ from transformers with the adapter merged"
        assert worst < 1e-4, name
        if name != "base":
            assert ours != hf_greedy(tiny["hf"], PROMPTS[name])[0], f"{name}: the adapter should change the tokens"
    for name, out in zip(names, outs):      # each request of the mixed batch equals the same request alone
        alone = llm.generate([PROMPTS[name]], GREEDY, lora_request=None if name == "base" else name)[0]
        a, b = tokens_and_logprobs(alone), tokens_and_logprobs(out)
        assert a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1])) < 1e-5, name


def test_an_adapter_on_experts_is_refused_by_name(tiny):
    arch = ArchConfig.from_hf_config(tiny["hf"].config.to_dict())
    hidden = arch.hidden_size
    for module in ("experts.3.gate_proj", "shared_experts.down_proj"):
        key = f"base_model.model.model.layers.1.mlp.{module}"     # refused by name, whatever the shapes
        extra = {f"{key}.lora_A.weight": torch.zeros(4, hidden), f"{key}.lora_B.weight": torch.zeros(hidden, 4)}
        path = write_peft_adapter(str(tiny["root"] / module), tiny["hf"], r=4, alpha=8, targets=("o_proj",),
                                  extra_tensors=extra)
        with pytest.raises(LoraAdapterError, match="adapters on experts are not supported"):
            read_peft_adapter(path, arch, 8, torch.float32)
    path = write_peft_adapter(str(tiny["root"] / "k_proj"), tiny["hf"], r=4, alpha=8, targets=("o_proj",),
                              config_changes={"target_modules": ["k_proj", "o_proj"]})
    with pytest.raises(LoraAdapterError, match="'k_proj' is not a linear this model has; supported: .*kv_b_proj"):
        read_peft_adapter(path, arch, 8, torch.float32)


def test_rank_slices_of_a_latent_attention_adapter_rebuild_the_full_delta(tiny):
    arch = ArchConfig.from_hf_config(tiny["hf"].config.to_dict())
    adapter = read_peft_adapter(tiny["full"], arch, 8, torch.float64)
    shards = [TensorShard(rank, 2, arch) for rank in range(2)]
    pieces = [shard_adapter(adapter, shard) for shard in shards]
    assert {target for _, target in adapter.weights} >= {"self_attn.kv_b_proj", "self_attn.o_proj",
                                                         "self_attn.q_b_proj", "mlp.down_proj"}
    for (layer, target), parts in adapter.weights.items():
        fan_in, _ = target_shapes(arch, layer)[target]
        x = torch.randn(5, fan_in, dtype=torch.float64)
        for p, (a, b) in enumerate(parts):
            full = x @ a.T @ b.T
            for shard, piece in zip(shards, pieces):
                a_r, b_r = piece.weights[(layer, target)][p]
                local_in, local_outs = target_shapes(shard.local_arch(), layer)[target]
                assert a_r.shape[1] == local_in and b_r.shape[0] == local_outs[p], target
                if target in REPLICATED:
                    assert a_r is a and b_r is b, target
                elif target in COLUMN_PARALLEL:
                    lo, hi = _row_ranges(shard, target)[p]
                    torch.testing.assert_close(x @ a_r.T @ b_r.T, full[:, lo:hi], rtol=0, atol=1e-12)
            if target not in REPLICATED and target not in COLUMN_PARALLEL:
                total = sum(x[:, slice(*_column_range(shard, target))] @ piece.weights[(layer, target)][p][0].T
                            @ piece.weights[(layer, target)][p][1].T for shard, piece in zip(shards, pieces))
                torch.testing.assert_close(total, full, rtol=0, atol=1e-12)


def test_batch_invariant_bits_under_an_adapter_alone_and_in_a_batch(tiny):
    """--batch-invariant: a request under the kv_b_proj adapter gets the same logits, bit for bit, alone and beside
    the base model and the other adapter (the absorbed products' deltas run in the base products' row blocks)."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    me = ("me", PROMPTS["kv"], params, 0, {"lora_request": "kv"})
    others = [("a", PROMPTS["full"], params, 0, {"lora_request": "full"}),
              ("b", PROMPTS["base"], params, 0, {}), ("c", PROMPTS["kv"][::-1], params, 2, {"lora_request": "kv"})]
    llm = LLM(model=tiny["path"], dtype="float32", max_model_len=128, num_kv_blocks=96, block_size=4,
              enable_lora=True, lora_modules=(f"full={tiny['full']}", f"kv={tiny['kv']}"), max_loras=2,
              max_lora_rank=8, batch_invariant=True, enable_prefix_caching=False)
    try:
        want_tokens, want = sampled_logits(llm, [me], "me")
        got_tokens, got = sampled_logits(llm, [others[0], (*me[:3], 1, me[4]), *others[1:]], "me")
    finally:
        llm.engine.close()
    assert got_tokens == want_tokens and len(got) == len(want) == 6
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"step {step}: {describe_difference(g, w)}"
