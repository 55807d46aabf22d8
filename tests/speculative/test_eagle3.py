"""The eagle3 method: a random EAGLE-3 head in the published format drafts what the reference recomputation from
scratch drafts at every step (caught up on the target's hidden states of the tokens verification kept), the output is
the non-speculative output, and heads that cannot serve the target are refused with what to do."""
from __future__ import annotations

import json
import os

import pytest
import torch

from gh200rt.config.speculative import read_speculative_config
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import SharedModel, save_tiny_llama
from tests.speculative.eagle3_files import ReferenceHead, write_eagle3_head
from tests.speculative.test_spec_engine import looping_prompts, same, through_preemption_chunks_and_sampling

AUX = (2, 2, 1)          # the default layers of a 4-layer target: 2, 4 // 2, 4 - 3


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3-heads")
    return {"head": write_eagle3_head(str(root / "head")),
            "own_embed_bin": write_eagle3_head(str(root / "bin"), own_embed=True, weights="pytorch_model.bin",
                                               aux_ids=[0, 3, 1], seed=1),
            "full_vocab": write_eagle3_head(str(root / "full"), draft_vocab=256, seed=2)}


def eagle3(path: str, k: int = 3) -> dict:
    return {"method": "eagle3", "model": path, "num_speculative_tokens": k}


def record_drafts(llm) -> list[tuple[list[int], list[int]]]:
    """Every (tokens so far, drafts) the engine's head proposes from now on."""
    proposer = llm.engine.speculator.draft
    seen = []
    propose = proposer.propose

    def recording(wanted):
        propose(wanted)
        seen.extend((list(seq.all_token_ids), list(seq.spec_drafts)) for seq, _ in wanted if seq.spec_drafts)
    proposer.propose = recording
    return seen


def test_the_head_drafts_what_a_recomputation_from_scratch_drafts(target, target_path, heads):
    reference = ReferenceHead(heads["head"], target_path, AUX)
    llm = target.llm(max_model_len=128, speculative_config=eagle3(heads["head"], 3))
    assert llm.engine.runner.capture_layers == AUX
    seen = record_drafts(llm)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm.generate(looping_prompts(3, seed=5), params)
    assert len(seen) >= 12
    compared = 0
    for tokens, drafts in seen:
        for got, logits in zip(drafts, reference.drafts(tokens, len(drafts))):
            top2 = logits.topk(2).values
            if top2[0] - top2[1] < 1e-4:       # a tie the two computations may break differently: stop here
                break
            assert got == int(logits.argmax()), (tokens, drafts)
            compared += 1
    assert compared >= 30


def test_greedy_output_and_logprobs_are_the_targets(target, heads):
    prompts = looping_prompts(5, seed=3)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
    want = target.llm(batch_invariant=True, max_model_len=128).generate(prompts, params)
    for name in ("head", "own_embed_bin", "full_vocab"):
        llm = target.llm(batch_invariant=True, max_model_len=128, speculative_config=eagle3(heads[name], 3))
        same(want, llm.generate(prompts, params))
        stats = llm.engine.speculator.stats
        assert stats.num_draft_tokens > 40, stats
    ledger = llm.engine.ledger.by_kind
    assert ledger["draft_weights"] > 0 and ledger["draft_kv"] == llm.engine.speculator.draft.kv_bytes > 0


def test_through_preemption_chunks_and_sampling(target, heads):
    for llm in through_preemption_chunks_and_sampling(target, eagle3(heads["head"], 4)):
        assert not llm.engine.speculator.draft.pending        # nothing kept for sequences that left


def test_the_draft_distribution_is_the_heads_over_its_vocabulary(target, heads):
    """Sampled drafts come from the head's tokens only (the rest of the target's vocabulary has no probability)."""
    llm = target.llm(max_model_len=128, speculative_config=eagle3(heads["head"], 2))
    seen = record_drafts(llm)
    llm.generate(looping_prompts(4, seed=7), SamplingParams(temperature=1.5, max_tokens=12, ignore_eos=True, seed=1))
    allowed = set(llm.engine.speculator.draft.head.target_ids.tolist())
    drafted = [t for _, drafts in seen for t in drafts]
    assert len(drafted) > 20 and set(drafted) <= allowed


def test_heads_that_cannot_serve_are_refused_with_what_to_do(target, heads, tmp_path, target_path):
    with pytest.raises(ValueError, match="needs \"model\""):
        read_speculative_config({"method": "eagle3", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="is not a directory"):
        target.llm(speculative_config=eagle3(str(tmp_path / "nowhere")))
    wrong_vocab = write_eagle3_head(str(tmp_path / "vocab"), vocab=320)
    with pytest.raises(ValueError, match="vocabulary of 320 tokens, the target has 256"):
        target.llm(speculative_config=eagle3(wrong_vocab))
    wrong_width = write_eagle3_head(str(tmp_path / "width"), hidden=32, heads=2, kv_heads=1)
    with pytest.raises(ValueError, match="hidden states of width 32, the target's are 64"):
        target.llm(speculative_config=eagle3(wrong_width))
    out_of_range = write_eagle3_head(str(tmp_path / "layers"), aux_ids=[1, 2, 7])
    with pytest.raises(ValueError, match=r"layers \[1, 2, 7\], the target has 4 layers"):
        target.llm(speculative_config=eagle3(out_of_range))
    eagle1 = write_eagle3_head(str(tmp_path / "eagle1"), extra={"architectures": ["LlamaForCausalLMEagle"]})
    with pytest.raises(ValueError, match="EAGLE-1/2 heads and other draft formats are not supported"):
        target.llm(speculative_config=eagle3(eagle1))
    missing = write_eagle3_head(str(tmp_path / "missing"))
    from safetensors.torch import load_file, save_file
    file = os.path.join(missing, "model.safetensors")
    tensors = load_file(file)
    tensors.pop("midlayer.hidden_norm.weight")
    tensors["midlayer.extra.weight"] = torch.zeros(2)
    save_file(tensors, file)
    with pytest.raises(ValueError, match="unexpected tensors midlayer.extra.weight; missing tensors "
                                         "midlayer.hidden_norm.weight"):
        target.llm(speculative_config=eagle3(missing))
    two_layers = write_eagle3_head(str(tmp_path / "two"), extra={"num_hidden_layers": 2})
    with pytest.raises(ValueError, match="has 2 decoder layers; an EAGLE-3 head has one"):
        target.llm(speculative_config=eagle3(two_layers))
    with open(os.path.join(target_path, "config.json")) as f:
        assert json.load(f)["num_hidden_layers"] == 4


def test_default_layers_need_a_target_deep_enough(tmp_path):
    """A 2-layer target has no layer L-3: the head must name its layers."""
    shallow = SharedModel(save_tiny_llama(str(tmp_path / "shallow"), num_layers=2))
    head = write_eagle3_head(str(tmp_path / "head"))
    with pytest.raises(ValueError, match="set eagle_config.eagle_aux_hidden_state_layer_ids"):
        shallow.llm(speculative_config=eagle3(head))
    named = write_eagle3_head(str(tmp_path / "named"), aux_ids=[0, 1, 1])
    llm = shallow.llm(max_model_len=64, speculative_config=eagle3(named, 2))
    out = llm.generate(looping_prompts(2, seed=1), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 6 for o in out)


def test_steps_replay_decode_graphs_with_the_hidden_states(target, heads):
    """On the bucketed graph path (the CPU's stand-in for CUDA graphs) each replay returns the captured layers'
    hidden states beside the final ones: the output is the eager engine's and the head drafts what it drafts there
    (the padded row count may round a hidden state differently: a rare draft may differ, never an output token)."""
    prompts = looping_prompts(3, seed=21)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    runs = []
    for eager in (True, False):
        llm = target.llm(max_model_len=128, max_num_seqs=4, enforce_eager=eager,
                         speculative_config=eagle3(heads["head"], 3))
        seen = record_drafts(llm)
        out = llm.generate(prompts, params)
        runs.append(([o.outputs[0].token_ids for o in out], seen, llm.engine.graphs))
    (want, eager_drafts, _), (got, graph_drafts, graphs) = runs
    assert got == want
    assert graphs is not None and max(graphs.graphs) > len(prompts), sorted(graphs.graphs)   # verifying rows replayed
    # proposals keyed by the tokens they followed (a draft kept in one run and not the other shifts the steps)
    eager_by, graph_by = ({tuple(tokens): drafts for tokens, drafts in seen} for seen in (eager_drafts, graph_drafts))
    common = eager_by.keys() & graph_by.keys()
    assert len(common) >= 0.9 * len(eager_by) and len(eager_by) > 10
    assert sum(eager_by[k] == graph_by[k] for k in common) >= 0.9 * len(common)


def test_a_head_drafts_over_host_blocks_read_in_place(target, heads):
    """The target reads a conversation's earlier turns in place from the host KV tier, where it computed no hidden
    state: the head drafts on for those sequences over what its table names there (block 0), and the tokens are
    plain decoding's."""
    from tests.engine.test_host_kv_tier import conversations, synchronous_stores, talk
    firsts = conversations(256, count=3, system=0)
    options = dict(batch_invariant=True, num_kv_blocks=8, max_model_len=96)
    want = talk(target.llm(**options), firsts, turns=2, max_tokens=6)
    llm = target.llm(kv_offloading_size="8MiB", kv_offloading_reads="in_place",
                     speculative_config=eagle3(heads["head"], 3), **options)
    synchronous_stores(llm)
    proposer, over_host = llm.engine.speculator.draft, []
    propose = proposer.propose

    def recording(wanted):
        propose(wanted)
        over_host.extend(seq for seq, _ in wanted if seq.spec_drafts and max(seq.block_ids) >= proposer.first_host_id)
    proposer.propose = recording
    assert talk(llm, firsts, turns=2, max_tokens=6) == want
    assert llm.engine.stats().kv_host.read_in_place_blocks >= 3
    assert over_host, "no sequence reading host blocks in place drafted"
