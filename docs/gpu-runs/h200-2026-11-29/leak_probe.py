"""Device bytes left allocated after an engine closes (call 1's tiers run: +32 MiB per engine on the H200): build,
run and close the same small engine several times in one process, print torch's allocated bytes after each, and
the stack of every block still alive after the third that was not alive after the first."""
import gc
import sys
import tempfile

import torch

from gh200rt.config import EngineConfig
from gh200rt.engine.engine import LLMEngine
from gh200rt.engine.llm import LLM
from gh200rt.sampling_params import SamplingParams
from tests.engine.real_models import save_tiny_llama


def settled() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def live_blocks() -> dict:
    blocks = {}
    for segment in torch.cuda.memory._snapshot()["segments"]:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                blocks[block["address"]] = block
    return blocks


path = save_tiny_llama(tempfile.mkdtemp(), num_layers=4)
torch.cuda.memory._record_memory_history(max_entries=200000)
print("before any engine", settled())
seen = []
for i, offload in enumerate(sys.argv[1:] or ["none", "none", "none", "stream"]):
    engine = LLMEngine.from_config(EngineConfig.from_kwargs(model=path, dtype="bfloat16", max_model_len=64,
                                                            num_kv_blocks=32, offload=offload))
    LLM.from_engine(engine).generate([[5, 6, 7], [8, 9]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    engine.close()
    del engine
    print(f"after engine {i} ({offload}) closed: {settled()} bytes allocated", flush=True)
    seen.append(live_blocks())
new = {a: b for a, b in seen[-1].items() if a not in seen[0]}
print(f"{len(new)} blocks alive after the last engine that were not after the first: "
      f"{sum(b['size'] for b in new.values())} bytes")
for block in list(new.values())[:6]:
    frames = block.get("frames") or []
    print(f"-- {block['size']} bytes")
    for f in frames[:14]:
        print(f"   {f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}")
