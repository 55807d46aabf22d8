"""Tensor parallelism on the CPU: per decode step time and the share spent in collectives, TP=1 vs TP=N.

Writes a small random Llama (float32), generates greedily with one rank and with N, and on rank 0 times every
collective of the data group (the row-parallel all-reduces, the embedding's all-reduce, the logits gather) and the
step broadcast on the control group. Rank 0 waits in a collective for the slowest rank, so its collective time
includes load imbalance, not only transfer time; the bytes all-reduced per step are printed beside it.

    python -m gh200rt.bench tp [--tp 2] [--hidden 512] [--layers 4] [--steps 32] [--batch 1]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from gh200rt.bench.random_model import write_tokenizer


def write_model(path: str, hidden: int, layers: int, vocab: int) -> str:
    import transformers

    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                                      max_position_embeddings=1024, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path, vocab)
    return path


class CollectiveClock:
    """Wraps rank 0's ParallelState methods to add up the seconds and bytes of each kind of collective."""

    def __init__(self, state):
        self.seconds = {"all_reduce": 0.0, "gather_last_dim": 0.0, "broadcast_control": 0.0}
        self.bytes = dict.fromkeys(self.seconds, 0)
        for name in self.seconds:
            self._wrap(state, name)

    def _wrap(self, state, name):
        inner = getattr(state, name)

        def timed(tensor):
            start = time.perf_counter()
            out = inner(tensor)
            self.seconds[name] += time.perf_counter() - start
            self.bytes[name] += tensor.numel() * tensor.element_size()
            return out
        setattr(state, name, timed)

    def reset(self):
        for name in self.seconds:
            self.seconds[name], self.bytes[name] = 0.0, 0


def decode_steps(path: str, tp: int, steps: int, batch: int) -> dict:
    from gh200rt.config import EngineConfig
    from gh200rt.engine.engine import LLMEngine
    from gh200rt.engine.llm import LLM
    from gh200rt.sampling_params import SamplingParams
    config = EngineConfig.from_kwargs(model=path, dtype="float32", num_kv_blocks=256, max_model_len=512,
                                      max_num_seqs=batch, tensor_parallel_size=tp,
                                      device_memory_budget="2GiB")
    llm = LLM.from_engine(LLMEngine.from_config(config))
    try:
        prompts = [[5 + i, 9, 33, 71, 100, 4, 17, 23] for i in range(batch)]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4))           # warm-up
        state = llm.engine.runner.model.state if tp > 1 else None
        clock = CollectiveClock(state) if state is not None else None
        engine = llm.engine
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", None, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True),
                               prompt_token_ids=p)
        engine.step()                                                                  # the prefill
        if clock:
            clock.reset()
        start, decode_steps = time.perf_counter(), 0
        while engine.has_unfinished_requests():
            engine.step()
            decode_steps += 1
        seconds = (time.perf_counter() - start) / decode_steps
        out = {"tp": tp, "step_ms": seconds * 1e3, "steps": decode_steps}
        if clock:
            total = sum(clock.seconds.values()) / decode_steps
            out.update(collective_ms=total * 1e3, share=total / seconds,
                       per_kind_ms={k: v / decode_steps * 1e3 for k, v in clock.seconds.items()},
                       all_reduce_bytes=clock.bytes["all_reduce"] // decode_steps)
        return out
    finally:
        llm.engine.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)


def run(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_model(os.path.join(tmp, "llama"), args.hidden, args.layers, args.vocab)
        weights = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))
        print(f"model: Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, float32, "
              f"{weights / 2**20:.1f} MiB; batch {args.batch}, {args.steps} decode steps; {os.cpu_count()} CPUs")
        base = decode_steps(path, 1, args.steps, args.batch)
        print(f"TP=1: {base['step_ms']:.2f} ms per step ({weights / base['step_ms'] / 1e6:.2f} GB/s of weights read)")
        tp = decode_steps(path, args.tp, args.steps, args.batch)
        kinds = ", ".join(f"{k} {v:.2f} ms" for k, v in tp["per_kind_ms"].items())
        print(f"TP={args.tp}: {tp['step_ms']:.2f} ms per step ({base['step_ms'] / tp['step_ms']:.2f}x TP=1), "
              f"collectives on rank 0 {tp['collective_ms']:.2f} ms = {tp['share'] * 100:.0f}% of the step "
              f"({kinds}); {tp['all_reduce_bytes'] / 1024:.1f} KiB all-reduced per step")
    return 0
