"""Per-request logits processing that runs before any sampling decision: ``allowed_token_ids``,
``logit_bias``, ``bad_words`` and the structured-output token masks. Each is applied to the whole batch at once,
in place:

* allowed_token_ids: one boolean mask over the restricted rows, -inf wherever a token is not listed;
* logit_bias: one ``index_put_`` with accumulate over every (row, token, bias) of the batch;
* bad_words: as vLLM, a word's last token is -inf where the output so far ends with the tokens before it (a
  one-token word always); one ``index_put_`` over every (row, token) of the batch;
* grammars: llguidance fills a packed bitmask (32 tokens per int32) for all constrained rows in
  parallel in its own threads; one tensor expression unpacks it and fills -inf where a bit is 0.

The sampler calls ``apply_logits_processors`` after it took the raw logprobs (so logprobs describe
the model's distribution, as vLLM reports them by default) and before greedy or random choice.
"""
from __future__ import annotations

import torch

from gh200rt.engine.device_inputs import to_device
from gh200rt.scheduler.request import Sequence


@torch.inference_mode()       # the model's logits are inference tensors: in-place updates need this mode
def apply_logits_processors(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """In place on ``logits`` [B, V]; row b belongs to ``seqs[b]``."""
    assert logits.dim() == 2 and logits.shape[0] == len(seqs)
    restricted = [(row, seq.params.allowed_token_ids) for row, seq in enumerate(seqs) if seq.params.allowed_token_ids]
    if restricted:
        apply_allowed_token_ids(logits, restricted)
    biased = [(row, seq.params.logit_bias) for row, seq in enumerate(seqs) if seq.params.logit_bias]
    if biased:
        apply_logit_bias(logits, biased)
    banned = [(row, tokens) for row, seq in enumerate(seqs) if (tokens := bad_word_tokens(seq))]
    if banned:
        apply_banned_tokens(logits, banned)
    # a finished row is one a step launched ahead holds after its sequence stopped: its token is dropped
    constrained = [(row, seq.grammar) for row, seq in enumerate(seqs)
                   if getattr(seq, "grammar", None) is not None and seq.grammar.masking and not seq.grammar.failed
                   and not seq.is_finished]
    if constrained:
        apply_grammar_masks(logits, constrained)


def apply_allowed_token_ids(logits: torch.Tensor, restricted: list[tuple[int, list[int]]]) -> None:
    banned = torch.ones((len(restricted), logits.shape[1]), dtype=torch.bool)
    for i, (_, ids) in enumerate(restricted):
        banned[i, ids] = False
    rows = to_device([row for row, _ in restricted], torch.int64, logits.device)
    logits[rows] = logits[rows].masked_fill(banned.to(logits.device, non_blocking=True), float("-inf"))


def apply_logit_bias(logits: torch.Tensor, biased: list[tuple[int, dict[int, float]]]) -> None:
    rows = [row for row, bias in biased for _ in bias]
    cols = [token for _, bias in biased for token in bias]
    values = [value for _, bias in biased for value in bias.values()]
    index = (to_device(rows, torch.int64, logits.device), to_device(cols, torch.int64, logits.device))
    logits.index_put_(index, to_device(values, logits.dtype, logits.device), accumulate=True)


def bad_word_tokens(seq: Sequence) -> list[int]:
    """The tokens that would complete one of ``seq``'s bad words next (its output so far ends with the rest)."""
    words = seq.params.bad_words_token_ids
    if not words:
        return []
    out = seq.output_token_ids
    return [ids[-1] for ids in words
            if len(ids) - 1 <= len(out) and (len(ids) == 1 or out[len(out) - len(ids) + 1:] == ids[:-1])]


def apply_banned_tokens(logits: torch.Tensor, banned: list[tuple[int, list[int]]]) -> None:
    rows = [row for row, tokens in banned for _ in tokens]
    cols = [token for _, tokens in banned for token in tokens]
    index = (to_device(rows, torch.int64, logits.device), to_device(cols, torch.int64, logits.device))
    logits.index_put_(index, torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))


def apply_grammar_masks(logits: torch.Tensor, constrained: list) -> None:
    """``constrained``: (row, SequenceGrammar) pairs sharing one llguidance executor."""
    vocab = logits.shape[1]
    words = (vocab + 31) // 32
    # page-locked on a GPU: a copy from pageable memory would wait for the stream (a step launched ahead)
    bitmask = torch.empty((len(constrained), words), dtype=torch.int32, pin_memory=logits.device.type == "cuda")
    executor = constrained[0][1].executor
    executor.unsafe_compute_mask_ptr([(g.matcher, i) for i, (_, g) in enumerate(constrained)],
                                     bitmask.data_ptr(), words * 4, len(constrained))
    rows = to_device([row for row, _ in constrained], torch.int64, logits.device)
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), vocab)
    allow_also(allowed, [g.also_allowed for _, g in constrained])
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def allow_also(allowed: torch.Tensor, extra: list[int | None]) -> None:
    """Allow row i's ``extra[i]`` token beside its grammar's mask (a reasoning block's opening token)."""
    for i, token in enumerate(extra):
        if token is not None:
            allowed[i, token] = True


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, W] int32 (bit j of word w = token 32w + j allowed) -> [R, vocab] bool."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()
