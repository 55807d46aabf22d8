"""The mtp method on a tiny DeepSeek-V3 whose checkpoint ships a random multi-token-prediction layer (latent
attention, an MoE block, its own embeddings and head): at every step the engine drafts what a recomputation from
scratch with transformers' modules drafts, the output is the non-speculative output, the layer is booked, a GGUF
file's nextn block drafts as the safetensors layer does, and a model without the layer is refused with what to
do."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel
from tests.model.tiny_checkpoints import DEEPSEEK_FAMILIES, save_tiny
from tests.speculative.test_eagle3 import record_drafts
from tests.speculative.test_spec_engine import looping_prompts, same, through_preemption_chunks_and_sampling

LAYERS = 3          # the tiny V3's decoder layers: its MTP layer is model.layers.3


def add_mtp_layer(path: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Give the checkpoint at ``path`` a random MTP layer as DeepSeek ships it; returns the layer's tensors."""
    g = torch.Generator().manual_seed(seed)
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    source = f"model.layers.{LAYERS - 1}."        # an MoE layer: the MTP layer has its shapes
    layer = {}
    for name, t in tensors.items():
        if name.startswith(source):
            rest = name[len(source):]
            if "norm" in rest:
                layer[rest] = 0.5 + torch.rand(t.shape, generator=g)
            elif rest.endswith("e_score_correction_bias"):
                layer[rest] = 0.1 * torch.randn(t.shape, generator=g)
            else:
                layer[rest] = 0.15 * torch.randn(t.shape, generator=g)
    vocab, hidden = tensors["model.embed_tokens.weight"].shape
    layer.update({"embed_tokens.weight": 0.5 * torch.randn(vocab, hidden, generator=g),
                  "enorm.weight": 0.5 + torch.rand(hidden, generator=g),
                  "hnorm.weight": 0.5 + torch.rand(hidden, generator=g),
                  "eh_proj.weight": 0.1 * torch.randn(hidden, 2 * hidden, generator=g),
                  "shared_head.norm.weight": 0.5 + torch.rand(hidden, generator=g),
                  "shared_head.head.weight": 0.3 * torch.randn(vocab, hidden, generator=g)})
    tensors.update({f"model.layers.{LAYERS}.{rest}": t for rest, t in layer.items()})
    save_file(tensors, file, metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["num_nextn_predict_layers"] = 1
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return layer


class ReferenceMtp:
    """What the MTP layer drafts after a sequence's tokens, from scratch: the target's final hidden states and the
    layer's decoder block from transformers (a one-layer model holding it, its norm and head the shared head's)."""

    def __init__(self, path: str, layer: dict[str, torch.Tensor]):
        import transformers
        self.target = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        _, kwargs = DEEPSEEK_FAMILIES["deepseek-v3"]
        config = transformers.DeepseekV3Config(**{
            **kwargs, "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-6, "num_hidden_layers": 1, "first_k_dense_replace": 0})
        self.block = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        state = {f"model.layers.0.{rest}": t for rest, t in layer.items()
                 if not rest.startswith(("embed_tokens", "enorm", "hnorm", "eh_proj", "shared_head", "mlp.experts."))}
        experts = config.n_routed_experts      # the file names each expert; the module stacks them
        state["model.layers.0.mlp.experts.gate_up_proj"] = torch.stack([torch.cat(
            [layer[f"mlp.experts.{e}.gate_proj.weight"], layer[f"mlp.experts.{e}.up_proj.weight"]])
            for e in range(experts)])
        state["model.layers.0.mlp.experts.down_proj"] = torch.stack(
            [layer[f"mlp.experts.{e}.down_proj.weight"] for e in range(experts)])
        state.update({"model.norm.weight": layer["shared_head.norm.weight"],
                      "lm_head.weight": layer["shared_head.head.weight"]})
        missing, unexpected = self.block.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"model.embed_tokens.weight"}, (missing, unexpected)
        self.layer = layer
        self.out = []
        self.block.model.layers[0].register_forward_hook(
            lambda m, i, o: self.out.append(o if isinstance(o, torch.Tensor) else o[0]))

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    @torch.no_grad()
    def drafts(self, token_ids: list[int], k: int) -> list[torch.Tensor]:
        ids = torch.tensor(token_ids)
        hidden = self.target.model(ids[None, :-1]).last_hidden_state[0]
        tokens = ids[1:]
        w = self.layer
        out = []
        for _ in range(k):
            embeds = w["embed_tokens.weight"][tokens].clone()
            embeds[0] = 0.0                               # position 0's row
            x = torch.cat([self._rms(embeds, w["enorm.weight"]), self._rms(hidden, w["hnorm.weight"])], -1) \
                @ w["eh_proj.weight"].T
            self.out.clear()
            logits = self.block(inputs_embeds=x[None]).logits[0]
            out.append(logits[-1])
            tokens = torch.cat([tokens, logits[-1].argmax()[None]])
            hidden = torch.cat([hidden, self.out[0][0, -1:]])
        return out


@pytest.fixture(scope="module")
def v3_mtp(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("deepseek-v3-mtp"))
    save_tiny("deepseek-v3", path)
    return path, add_mtp_layer(path)


@pytest.fixture(scope="module")
def target(v3_mtp):
    return SharedModel(v3_mtp[0])


def mtp(path: str | None, k: int = 2) -> dict:
    return {"method": "mtp", "num_speculative_tokens": k, **({"model": path} if path else {})}


def test_the_layer_drafts_what_a_recomputation_from_scratch_drafts(target, v3_mtp):
    path, layer = v3_mtp
    reference = ReferenceMtp(path, layer)
    llm = target.llm(max_model_len=96, speculative_config=mtp(path, 3))
    assert llm.engine.runner.capture_layers == (LAYERS,)
    seen = record_drafts(llm)
    llm.generate(looping_prompts(3, seed=4), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert len(seen) >= 8
    compared = 0
    for tokens, drafts in seen:
        for got, logits in zip(drafts, reference.drafts(tokens, len(drafts))):
            top2 = logits.topk(2).values
            if top2[0] - top2[1] < 1e-4:
                break
            assert got == int(logits.argmax()), (tokens, drafts)
            compared += 1
    assert compared >= 20


def test_through_preemption_chunks_and_sampling(target, v3_mtp):
    for llm in through_preemption_chunks_and_sampling(target, mtp(v3_mtp[0], 2)):
        assert llm.engine.speculator.stats.num_draft_tokens > 30


def test_a_placed_engine_reads_the_layer_from_its_own_checkpoint_and_books_it(v3_mtp):
    path, _ = v3_mtp
    llm = LLM(path, dtype="float32", max_model_len=64, speculative_config=mtp(None, 2))
    try:
        engine = llm.engine
        out = llm.generate(looping_prompts(2, seed=2), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        assert all(len(o.outputs[0].token_ids) == 8 for o in out)
        ledger = engine.ledger.by_kind
        proposer = engine.speculator.draft
        assert ledger["draft_weights"] > 0 and ledger["draft_kv"] == proposer.kv_bytes > 0
        assert proposer.kv_caches[0].shape[0] == 1            # one latent plane, as the target's layers
        assert engine.speculator.stats.num_draft_tokens > 0
    finally:
        llm.engine.close()


def test_a_model_without_the_layer_is_refused(target, tmp_path):
    plain = str(tmp_path / "plain")
    save_tiny("deepseek-v3", plain, num_nextn_predict_layers=0)
    with pytest.raises(ValueError, match="this model has none; use ngram, suffix, draft_model or eagle3"):
        SharedModel(plain).llm(speculative_config=mtp(plain))
    broken = str(tmp_path / "broken")
    save_tiny("deepseek-v3", broken)
    add_mtp_layer(broken)
    tensors = load_file(os.path.join(broken, "model.safetensors"))
    del tensors[f"model.layers.{LAYERS}.eh_proj.weight"]
    save_file(tensors, os.path.join(broken, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"missing weights: model\.layers\.{LAYERS}\.eh_proj\.weight.*declares "
                                         r"num_nextn_predict_layers 1"):
        SharedModel(broken).llm(speculative_config=mtp(broken))


def test_a_gguf_files_nextn_block_drafts_what_the_safetensors_layer_drafts(tmp_path):
    """llama.cpp's file of a checkpoint with its MTP layer as a ``nextn`` block: in F32 (the same values) every draft
    the checkpoint's engine makes, at every step; in Q8_0 (the layer dequantized) the file's own non-speculative
    output. (The checkpoint's YaRN mscale equals mscale_all_dim, as in DeepSeek's configs: a GGUF file keeps one.)"""
    pytest.importorskip("gguf")
    from tests.model.tiny_checkpoints import YARN_ROPE
    from tests.model.tiny_gguf import gguf_tensors, write_gguf
    path = str(tmp_path / "hf")
    save_tiny("deepseek-v3", path, rope_parameters={**YARN_ROPE, "mscale": YARN_ROPE["mscale_all_dim"]})
    add_mtp_layer(path)
    prompts = looping_prompts(2, seed=5)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    runs = {}
    for name in ("hf", "F32", "Q8_0"):
        source = path if name == "hf" else str(tmp_path / f"{name}.gguf")
        if name != "hf":
            write_gguf(path, source, name, tensors=gguf_tensors(path, mtp=True), nextn_blocks=1)
        shared = SharedModel(source)
        plain = [o.outputs[0].token_ids for o in shared.llm(max_model_len=96).generate(prompts, params)]
        drafting = shared.llm(max_model_len=96, speculative_config=mtp(source, 2))
        seen = record_drafts(drafting)
        assert [o.outputs[0].token_ids for o in drafting.generate(prompts, params)] == plain, name
        assert drafting.engine.speculator.stats.num_draft_tokens > 0
        runs[name] = seen
    assert runs["F32"] == runs["hf"] and len(runs["hf"]) >= 10
    broken = gguf_tensors(path, mtp=True)
    del broken[f"blk.{LAYERS}.nextn.eh_proj.weight"]
    write_gguf(path, str(tmp_path / "broken.gguf"), tensors=broken, nextn_blocks=1)
    with pytest.raises(ValueError, match=rf"missing weights: model\.layers\.{LAYERS}\.eh_proj\.weight"):
        SharedModel(str(tmp_path / "broken.gguf")).llm(speculative_config=mtp(str(tmp_path / "broken.gguf"), 2))


def test_glm45s_layer_drafts_losslessly(tmp_path):
    """GLM-4.5 ships its MTP layer under the same names (its decoder layer: GQA with partial RoPE and q/k norm)."""
    path = str(tmp_path / "glm")
    save_tiny("glm4-moe-qk-norm", path)
    add_mtp_layer(path)
    glm = SharedModel(path)
    prompts = looping_prompts(3, seed=8)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = glm.llm(batch_invariant=True, max_model_len=96).generate(prompts, params)
    llm = glm.llm(batch_invariant=True, max_model_len=96, speculative_config=mtp(path, 2))
    same(want, llm.generate(prompts, params))
    assert llm.engine.speculator.stats.num_draft_tokens > 20
    assert llm.engine.runner.capture_layers == (LAYERS,)


def test_the_layer_of_a_block_fp8_checkpoint_drafts_what_its_dequantized_twin_drafts(tmp_path):
    """DeepSeek ships the layer in fp8 with 128x128 block scales (16x16 here): the model's loader reads past its
    weights and their scales, and dequantized as it is read, tensor by tensor, it drafts exactly what the dense twin's
    layer drafts."""
    from tests.model.fp8_block_checkpoint import to_fp8_block_checkpoint
    path, twin = str(tmp_path / "fp8"), str(tmp_path / "twin")
    save_tiny("deepseek-v3", path)
    add_mtp_layer(path)
    names = to_fp8_block_checkpoint(path, (16, 16), twin=twin)
    assert any(n.startswith(f"model.layers.{LAYERS}.self_attn.") for n in names)
    runs = []
    for directory in (path, twin):
        llm = SharedModel(directory).llm(max_model_len=96, speculative_config=mtp(directory, 2))
        seen = record_drafts(llm)
        out = llm.generate(looping_prompts(2, seed=9), SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
        runs.append((seen, [o.outputs[0].token_ids for o in out]))
    assert runs[0] == runs[1] and len(runs[0][0]) > 5
