"""The ``draft_model`` method: a smaller model with the target's vocabulary drafts k tokens by decoding them itself.

The draft is resident on the engine's device, its weights and its KV cache booked in the device-memory ledger
before the target's KV pool takes what is left (``engine/bootstrap.py``). Its KV cache has the target pool's
blocks, same ids: a sequence's block table serves both models, so the draft needs no allocator of its own, and a
drafted position's blocks are the ones its verification writes. A sequence keeps ``draft_computed``, the positions
whose draft KV is valid; a step first catches the draft up on what it has not seen (the token verification emitted,
a whole prompt the first time), then decodes k - 1 more positions, one token per sequence per pass. What the draft
computes never decides an output token, only which drafts verification sees: its KV may be stale where another
sequence's prefix-cache blocks were adopted, which costs acceptance, never correctness. The pool's ids past its KV
blocks belong to resident weights' runs (kv/arena.py) and have no draft KV: a sequence holding such an id (a run a
tier move gave back) does not draft.

For a sequence that samples, the draft samples from its own distribution at the request's temperature (no top-k/p)
and keeps that row (``spec_draft_probs``), which rejection sampling needs; for a greedy one it takes its argmax.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from gh200rt.backends import backend_for
from gh200rt.config.model import ModelConfig
from gh200rt.config.speculative import SpeculativeMethod
from gh200rt.engine.model_runner import HostStep, ModelRunner, pack_arrays
from gh200rt.engine.sampler import Sampler, draw, greedy_tokens
from gh200rt.kv.block_row import block_row
from gh200rt.kv.pool import allocate_arch_kv_caches, arch_kv_bytes_per_block
from gh200rt.loader.embeddings import read_embeddings
from gh200rt.loader.errors import ModelLoadError
from gh200rt.loader.load import load_model
from gh200rt.loader.resolve import resolve_model_path
from gh200rt.scheduler.request import Sequence
from gh200rt.speculative.booking import DraftBooking

PROBE = "The quick brown fox: 0123456789 {\"key\": [1, 2]}\n\tdef f(x): return x ** 2  # café, 東京"


@dataclass
class DraftModel:
    """A loaded draft: its model (on the engine's device), architecture and the bytes its weights take there;
    ``kind``: the method (an ``eagle3`` draft is an ``eagle3.Eagle3Head`` of one layer)."""
    model: torch.nn.Module
    arch: object
    weight_bytes: int
    kind: str = "draft_model"

    def kv_bytes_per_block(self, block_size: int, kv_dtype: torch.dtype) -> int:
        return arch_kv_bytes_per_block(self.arch, block_size, kv_dtype)

    def booking(self, block_size: int, kv_dtype: torch.dtype) -> DraftBooking:
        return DraftBooking(self.weight_bytes, self.kv_bytes_per_block(block_size, kv_dtype))


def check_vocabulary(draft_tokenizer, draft_arch, tokenizer, arch, path: str) -> None:
    """A draft must speak the target's token ids: the same vocabulary size and the same ids for a probe text."""
    if draft_arch.vocab_size != arch.vocab_size:
        raise ValueError(f"--speculative-config: the draft model {path} has a vocabulary of {draft_arch.vocab_size} "
                         f"tokens, the target {arch.vocab_size}; a draft must use the target's tokenizer (a smaller "
                         f"model of the same family)")
    ours = tokenizer.encode(PROBE, add_special_tokens=False)
    theirs = draft_tokenizer.encode(PROBE, add_special_tokens=False)
    if list(ours) != list(theirs):
        raise ValueError(f"--speculative-config: the draft model {path} tokenizes text differently from the target "
                         f"(its vocabulary has the same size but other ids); use a draft of the target's family")


def load_draft(method: SpeculativeMethod, tokenizer, arch, dtype: torch.dtype, config, device: str) -> DraftModel:
    """Load ``method.model`` in ``dtype`` onto ``device``, checked against the target's vocabulary, with the
    backend's kernels installed (``config``: the engine's)."""
    try:
        resolve_model_path(method.model)
    except (FileNotFoundError, ValueError, ModelLoadError) as e:
        raise ValueError(f"--speculative-config: draft model {method.model!r} not found ({e}); give a Hugging Face "
                         f"directory, a .gguf file or an alias") from None
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    # the target's compute dtype; a forced --cpu-route decides it from the --dtype given with it (fp16 computes in
    # float32 and refuses --dtype float32)
    wanted = config.model.dtype if config.model.cpu_route is not None else names.get(dtype, "auto")
    model_config = ModelConfig(model=method.model, dtype=wanted, cpu_route=config.model.cpu_route)
    loaded = load_model(model_config, device=device)
    check_vocabulary(loaded.tokenizer, loaded.arch, tokenizer, arch, method.model)
    install(loaded.model, config, device, loaded.quantized)
    return DraftModel(loaded.model.eval(), loaded.arch, module_weight_bytes(loaded.model))


def load_eagle3_draft(method: SpeculativeMethod, target_model: torch.nn.Module, arch, dtype: torch.dtype, config,
                      device: str) -> DraftModel:
    """The EAGLE-3 head ``method.model`` for ``target_model`` on ``device``, with the backend's kernels installed;
    its weight bytes leave out the target's embeddings where it shares them."""
    from gh200rt.speculative.eagle3 import load_eagle3
    if not os.path.isdir(method.model):
        raise ValueError(f"--speculative-config: eagle3 head {method.model!r} is not a directory; give the directory "
                         f"of an EAGLE-3 head trained for the target (config.json and its weights)")
    if getattr(target_model, "shard", None) is None:
        def target_embed():
            return target_model.embed_tokens
    else:    # a tensor-parallel rank holds its vocabulary rows: the head on rank 0 reads them all
        def target_embed():
            return torch.nn.Parameter(read_embeddings(config.model.model, (arch.vocab_size, arch.hidden_size), dtype,
                                                      device), requires_grad=False)
    head = load_eagle3(method.model, target_embed, arch, dtype, device)
    install(head, config, device)
    shared = head.embed_tokens is getattr(target_model, "embed_tokens", None)
    return DraftModel(head, head.arch, module_weight_bytes(head, skip=("embed_tokens",) if shared else ()),
                      kind="eagle3")


def load_mtp_draft(checkpoint: str, arch, dtype: torch.dtype, config, device: str) -> DraftModel:
    """The multi-token-prediction layer of ``checkpoint`` (the target's) on ``device``, kernels installed."""
    from gh200rt.speculative.mtp import load_mtp
    layer = load_mtp(checkpoint, arch, dtype, device)
    install(layer, config, device)
    return DraftModel(layer, layer.arch, module_weight_bytes(layer), kind="mtp")


def install(module: torch.nn.Module, config, device: str, quantized: dict | None = None) -> None:
    """A draft's linears in the backend's resident form (``quantized``: its checkpoint's blocks, kept for single
    rows where the route keeps the target's) and its kernels in the hooks (the weight store does both for the
    target)."""
    backend = backend_for(device)
    backend.resident_forms(module, config, quantized)
    backend.install_kernels(module, config, device)


def module_weight_bytes(module: torch.nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Bytes of ``module``'s parameters, buffers and linear weights, each storage once (a tied head is its
    embeddings); ``skip``: parameters it shares with the target."""
    seen: dict[int, int] = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if name not in skip:
            seen[t.data_ptr()] = t.numel() * t.element_size()
    skipped = {getattr(module, name).data_ptr() for name in skip}
    packed = 0
    for m in module.modules():
        weight = getattr(getattr(m, "weight_ref", None), "current", None)
        if isinstance(weight, torch.Tensor):
            if weight.data_ptr() not in skipped:
                seen[weight.data_ptr()] = weight.numel() * weight.element_size()
        elif weight is not None:
            packed += int(weight.nbytes)
    return sum(seen.values()) + packed


def pack_draft_step(rows: list[tuple[Sequence, int, list[int]]], block_size: int,
                    host_from: int | None = None) -> HostStep:
    """The draft's step over ``rows``: (sequence, first position, the ids at that position on); every row samples
    its last position. ``host_from``: the first table entry that names a host KV block read in place (the draft
    keeps no KV there): such entries name block 0 in the draft's table instead, whatever it holds (the rows
    computed are past them: a block read in place is a full prompt block no step writes)."""
    ids, positions, slots, query_lens, seq_lens, tables, sample_rows = [], [], [], [], [], [], []
    starts = [0]
    for seq, start, tokens in rows:
        table = seq.block_ids
        end = start + len(tokens)
        ids += tokens
        positions += range(start, end)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        query_lens.append(len(tokens))
        seq_lens.append(end)
        row = block_row(seq)
        if host_from is not None and len(row) and row.max() >= host_from:
            assert table[start // block_size] < host_from, "a draft computes no position of a block read in place"
            row = np.where(row >= host_from, 0, row).astype(np.int32)
        tables.append(row)
        starts.append(starts[-1] + len(tokens))
        sample_rows.append(starts[-1] - 1)
    width = max(len(t) for t in tables)
    return HostStep(pack_arrays(ids, positions, slots, starts, seq_lens, sample_rows, tables, width), len(ids), width,
                    query_lens, seq_lens, sample_rows, {}, None)


def choose_drafts(logits: torch.Tensor, seqs: list[Sequence], sampler: Sampler) -> tuple[list[int], list]:
    """Each row's draft token: the argmax for a greedy request, else a draw from the draft's distribution at the
    request's temperature (its probabilities kept, for rejection sampling)."""
    tokens = greedy_tokens(logits)
    random_rows = [i for i, seq in enumerate(seqs) if not seq.params.greedy]
    probs: list = [None] * len(seqs)
    if random_rows:
        index = torch.tensor(random_rows, device=logits.device)
        temperature = torch.tensor([[seqs[i].params.temperature] for i in random_rows], device=logits.device)
        q = torch.softmax(logits.index_select(0, index).float() / temperature, dim=-1)
        tokens = tokens.index_copy(0, index, draw(q, sampler.uniforms(seqs, random_rows, logits.device)))
        for j, i in enumerate(random_rows):
            probs[i] = q[j]
    return tokens.tolist(), probs


class DraftProposer:
    """Drafts with a ``DraftModel`` over KV caches of the target pool's blocks."""

    def __init__(self, draft: DraftModel, num_blocks: int, block_size: int, kv_dtype: torch.dtype, device: str,
                 sampler: Sampler):
        a = draft.arch
        self.draft = draft
        self.block_size = block_size
        self.kv_caches = allocate_arch_kv_caches(a, num_blocks, block_size, kv_dtype, device)
        self.runner = ModelRunner(draft.model, self.kv_caches, block_size, device)
        self.sampler = sampler
        self.num_blocks = num_blocks

    @property
    def kv_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.kv_caches)

    @torch.inference_mode()
    def propose(self, wanted: list[tuple[Sequence, int]]) -> None:
        """Set ``spec_drafts`` (and ``spec_draft_probs`` for sampling sequences) of each (sequence, how many tokens
        it may draft); the target's block table already covers the positions drafted."""
        wanted = [(seq, room) for seq, room in wanted if max(seq.block_ids) < self.num_blocks]
        if not wanted:
            return
        rows = []
        for seq, _ in wanted:
            start = min(seq.draft_computed, seq.num_computed_tokens)
            rows.append((seq, start, seq.all_token_ids[start:]))
            seq.spec_drafts, seq.spec_draft_probs = [], []
        active = list(wanted)
        for step in range(max(room for _, room in wanted)):
            logits = self.runner.execute(pack_draft_step(rows, self.block_size)).sample_logits
            tokens, probs = choose_drafts(logits, [seq for seq, _ in active], self.sampler)
            for (seq, _), (_, start, ids), token, row in zip(active, rows, tokens, probs):
                seq.draft_computed = start + len(ids)
                seq.spec_drafts.append(token)
                if row is not None:
                    seq.spec_draft_probs.append(row)
            kept = [i for i, (seq, room) in enumerate(active) if room > step + 1]
            active = [active[i] for i in kept]
            rows = [(seq, seq.num_tokens - 1 + step + 1, [seq.spec_drafts[-1]]) for seq, _ in active]
            if not active:
                break
        for seq, _ in wanted:
            seq.spec_draft_probs = torch.stack(seq.spec_draft_probs) if seq.spec_draft_probs else None
