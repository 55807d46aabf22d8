"""Closing an engine releases every host slab it placed, at once, even while the engine object lives on."""
import gc

import pytest

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama

MIB = 1 << 20


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    # wide enough that each offloaded layer's slab is ~12 MiB: a leak of 40 engines' slabs is ~2 GiB
    return save_tiny_llama(str(tmp_path_factory.mktemp("wide")), num_layers=4, hidden_size=512,
                           intermediate_size=1280)


def build(path: str, **options) -> LLMEngine:
    config = EngineConfig.from_kwargs(model=path, dtype="float32", max_model_len=64, num_kv_blocks=8,
                                      max_num_seqs=4, **options)
    return LLMEngine.from_config(config)


def generate(eng: LLMEngine) -> list[int]:
    out = LLM.from_engine(eng).generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    return out[0].outputs[0].token_ids


@pytest.mark.parametrize("options", [dict(offload="stream", staging_slots=2, prefetch_distance=1),
                                     dict(offload="direct")], ids=["streamed", "direct"])
def test_close_unmaps_every_slab_while_the_engine_lives(wide_dir, options):
    eng = build(wide_dir, **options)
    generate(eng)
    slabs = [s.buffer for s in eng.store.slabs.values()]
    assert len(slabs) == 4
    eng.close()
    assert all(slab.unmapped for slab in slabs)
    with pytest.raises(RuntimeError, match="engine was closed"):
        generate(eng)
    eng.close()  # idempotent


def test_fifty_engines_leave_resident_memory_flat(wide_dir):
    psutil = pytest.importorskip("psutil")
    proc = psutil.Process()
    slab_bytes = 0
    rss_after: dict[int, int] = {}
    for i in range(50):
        eng = build(wide_dir, offload="stream", staging_slots=2, prefetch_distance=1)
        generate(eng)
        if i >= 10:
            slab_bytes += eng.store.host_slab_bytes()
        eng.close()
        del eng
        if i in (9, 49):
            gc.collect()
            rss_after[i] = proc.memory_info().rss
    growth = rss_after[49] - rss_after[9]
    assert slab_bytes > 1500 * MIB
    assert growth < 0.05 * slab_bytes, (f"RSS grew {growth / MIB:.0f} MiB over 40 engines that placed "
                                        f"{slab_bytes / MIB:.0f} MiB of slabs")
