"""The public API and the CLI on a tiny random Llama loaded by gh200rt's own loader."""
import pytest

from gh200rt import LLM, SamplingParams
from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.generate import main as generate_main
from tests.engine.real_models import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(str(tmp_path_factory.mktemp("tiny") / "llama"))


def test_llm_generate_prompt_forms_and_order(tiny_dir):
    llm = LLM(model=tiny_dir, max_model_len=64, num_kv_blocks=32, block_size=8, max_num_seqs=4,
              max_num_batched_tokens=32, enable_prefix_caching=True)
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    by_text = llm.generate(["w5 w6 w7", "w9"], greedy)
    by_ids = llm.generate([llm.tokenizer.encode("w5 w6 w7"), llm.tokenizer.encode("w9")], greedy)
    assert [o.token_ids for o in by_text] == [o.token_ids for o in by_ids]
    assert all(len(o.token_ids) == 5 and o.finish_reason == "length" for o in by_text)
    single = llm.generate(llm.tokenizer.encode("w9"), greedy)
    assert single[0].token_ids == by_text[1].token_ids
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(["a", "b"], [greedy])
    with pytest.raises(TypeError, match="unknown engine option"):
        LLM(model=tiny_dir, not_an_option=1)


def test_a_cpu_server_engine_steps_512_tokens_and_the_llm_class_2048(tiny_dir):
    """The token budget's platform default reaches the scheduler (SchedulerConfig.step_tokens); LLM asks 2048."""
    options = dict(model=tiny_dir, max_model_len=64, num_kv_blocks=16)
    assert LLMEngine.from_config(EngineConfig.from_kwargs(**options)).scheduler.max_num_batched_tokens == 512
    assert LLM(**options).engine.scheduler.max_num_batched_tokens == 2048
    asked = EngineConfig.from_kwargs(max_num_batched_tokens=40, **options)
    assert LLMEngine.from_config(asked).scheduler.max_num_batched_tokens == 40


def test_generate_cli_streams_text(tiny_dir, capsys):
    assert generate_main(["--model", tiny_dir, "--prompt", "w5 w6", "--max-tokens", "4", "--ignore-eos",
                          "--max-model-len", "64", "--num-kv-blocks", "16"]) == 0
    assert capsys.readouterr().out.strip()


def test_generate_cli_rejects_bad_sampling_flag(tiny_dir):
    with pytest.raises(SystemExit) as e:
        generate_main(["--model", tiny_dir, "--prompt", "x", "--top-p", "0"])
    assert e.value.code == 2
