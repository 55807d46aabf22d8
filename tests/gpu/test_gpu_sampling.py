"""Sampling on a GPU: every parameter with logits on CUDA (generators, penalty tables and masks all on
the device), seeded rows batch-independent, and the engine generating with temperature > 0."""
import pytest
import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.engine.sampler import Sampler
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama
from tests.unit.test_sampler_batch import ROW_PARAMS, VOCAB, make_seq, reference_row

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("trial", range(3))
def test_batch_on_cuda_matches_rows_alone(trial):
    logits = (torch.randn(len(ROW_PARAMS), VOCAB, generator=torch.Generator().manual_seed(trial)) * 3).cuda()
    seqs = [make_seq(i, p) for i, p in enumerate(ROW_PARAMS)]
    result = Sampler(seed=trial)(logits, seqs)
    for i, seq in enumerate(seqs):
        gen = torch.Generator(device=logits.device).manual_seed(make_seq(i, ROW_PARAMS[i]).seed)
        assert result.token_ids[i] == reference_row(logits[i], seq, gen), ROW_PARAMS[i]
        if seq.params.logprobs is not None:
            assert result.logprobs[i][result.token_ids[i]].logprob == pytest.approx(result.chosen_logprobs[i])


def test_unseeded_temperature_sampling_follows_the_distribution_on_cuda():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1).cuda()
    seqs = [make_seq(i, dict(temperature=1.0)) for i in range(4000)]
    for s in seqs:
        s.seed = None
    ids = torch.tensor(Sampler(seed=1)(logits, seqs).token_ids)
    freq = torch.bincount(ids, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03), freq


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny2-sampling")), num_layers=2)


def test_engine_samples_on_cuda(tiny_dir):
    config = EngineConfig.from_kwargs(model=tiny_dir, dtype="float32", max_model_len=64, num_kv_blocks=32)
    engine = LLMEngine.from_config(config)
    assert engine.runner.device == "cuda"
    llm = LLM.from_engine(engine)
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.01, repetition_penalty=1.2,
                            presence_penalty=0.3, frequency_penalty=0.2, seed=7, max_tokens=8, ignore_eos=True,
                            logprobs=2, n=2)
    batch = llm.generate([[5, 6, 7], [9, 10], [11]], params)
    alone = llm.generate([[5, 6, 7]], params)
    assert [c.token_ids for c in batch[0].outputs] == [c.token_ids for c in alone[0].outputs]
    assert all(len(c.token_ids) == 8 for o in batch for c in o.outputs)
    unseeded = llm.generate([[5, 6, 7]], SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True))
    assert len(unseeded[0].outputs[0].token_ids) == 8
    engine.close()


@pytest.mark.parametrize("trial", range(3))
def test_penalties_on_cuda_give_the_cpus_bits_with_tokens_in_flight(trial):
    # positions listed twice (a window's repeats, a token in flight the row holds) are written twice on the GPU,
    # in no set order: both writes must carry the same value
    import random

    from gh200rt.engine.penalties import apply_penalties
    from tests.unit.test_penalties import ROWS, VOCAB as PENALTY_VOCAB, make_seq as make_penalised
    rng = random.Random(trial)
    cpu_seqs = [make_penalised(i, p, random.Random(trial * 100 + i)) for i, p in enumerate(ROWS)]
    gpu_seqs = [make_penalised(i, p, random.Random(trial * 100 + i)) for i, p in enumerate(ROWS)]
    for a, b in zip(cpu_seqs, gpu_seqs):
        for _ in range(rng.randrange(2, 9)):
            token = rng.choice(a.all_token_ids) if rng.random() < 0.6 else rng.randrange(PENALTY_VOCAB)
            a.append_token(token)
            b.append_token(token)
    rows = list(range(len(ROWS)))
    fed = [i for i in rows if i % 3]
    tokens = torch.tensor([cpu_seqs[i].output_token_ids[-1] if i % 2 else PENALTY_VOCAB - 1 for i in fed])
    logits = torch.randn(len(ROWS), PENALTY_VOCAB, generator=torch.Generator().manual_seed(trial)) * 3
    want, got = logits.clone(), logits.cuda()
    apply_penalties(want, cpu_seqs, rows, (fed, tokens))
    apply_penalties(got, gpu_seqs, rows, (fed, tokens.cuda()))
    assert torch.equal(got.cpu(), want)
