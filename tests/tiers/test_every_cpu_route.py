"""Every CPU route this machine executes serves every placement (``cpu_route`` fixture: fp32, fp16, bf16, and fp32
on the portable native build): streamed and direct layers compute the same bits from the same host bytes (slots
poisoned before every copy), resident layers hold the route's own form, and on the fp32 routes resident layers
compute those bits too (DESIGN invariant 4)."""
import pytest

from gh200rt.backends.cpu.prepack import linear_formats
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.models.layers.dense import onednn_available
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama

PROMPTS = [[5, 9, 13, 17], [40, 41], list(range(60, 90))]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
LAYERS = 4
PLACEMENTS = {
    "resident": dict(offload="none"),
    "streamed": dict(offload="stream", staging_slots=2, prefetch_distance=1),
    "direct": dict(offload="direct"),
}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("wide") / "wide"), vocab_size=512, num_layers=LAYERS,
                           hidden_size=512, intermediate_size=1024)


def run(eng: LLMEngine):
    outs = LLM.from_engine(eng).generate(PROMPTS, PARAMS)
    return [(o.outputs[0].token_ids, [sorted(lp.items()) for lp in o.outputs[0].logprobs]) for o in outs]


def test_every_placement_serves_on_the_route(wide, cpu_route):
    if cpu_route.name.startswith("fp32") and not onednn_available():
        pytest.skip("this torch has no oneDNN inner product: the fp32 route keeps dense weights")
    dense = f"dense {str(cpu_route.dtype).removeprefix('torch.')}"
    outputs = {}
    for label, placement in PLACEMENTS.items():
        eng = LLMEngine.from_config(EngineConfig.from_kwargs(model=wide, max_model_len=128, **placement,
                                                             **cpu_route.options), poison=True)
        assert eng.runner.model.dtype == cpu_route.dtype
        resident_layers = LAYERS if label == "resident" else 0
        # offloaded layers' linears compute from dense weights in the route's dtype
        want = {cpu_route.resident_form: 4 * resident_layers + 1, dense: 4 * (LAYERS - resident_layers)}
        assert linear_formats(eng.runner.model) == {k: n for k, n in want.items() if n}, label
        outputs[label] = run(eng)
        assert all(len(tokens) == PARAMS.max_tokens for tokens, _ in outputs[label])
        eng.close()
    assert outputs["streamed"] == outputs["direct"]
    if cpu_route.name.startswith("fp32"):
        assert outputs["resident"] == outputs["direct"]
