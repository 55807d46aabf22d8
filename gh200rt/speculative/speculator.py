"""``Speculator``: the engine's drafting. Before a step is scheduled it drafts up to k tokens for each running
sequence that decodes (``Sequence.spec_drafts``), never more than the sequence may still produce: a step emits at
most k + 1 tokens, within ``max_tokens`` and the context; the scheduler takes what fits its token budget and the KV
pool. A draft model writes its KV at the drafted positions, so their blocks are allocated before it runs, where the
pool keeps a block per running sequence beside them (drafting never causes a preemption the step would not have had).
It also counts what verification accepted (vLLM's ``spec_decode_*`` series). With ``num_speculative_tokens: "auto"``
each step's k comes from ``auto_k.AutoK``, fed the verifications and the decode steps' times."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gh200rt.config.speculative import SpeculativeMethod
from gh200rt.scheduler.request import Sequence
from gh200rt.speculative.auto_k import AutoK
from gh200rt.speculative.ngram import NgramProposer
from gh200rt.speculative.suffix import SuffixProposer

log = logging.getLogger(__name__)


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0                 # sequences' steps that verified at least one drafted token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)   # [k]: drafts accepted at each position
    current_k: int | None = None        # the k of the latest step's drafting ("auto": chosen per step)

    def copy(self) -> "SpecDecodeStats":
        return SpecDecodeStats(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                               list(self.accepted_per_pos), self.current_k)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verifying step emits per sequence on average (accepted drafts + the target's own)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


def draft_room(seq: Sequence, k: int) -> int:
    """How many tokens ``seq`` may draft: a step then emits at most that many + 1, within max_tokens and the
    context."""
    room = seq.max_model_len - seq.num_tokens - 1
    if seq.params.max_tokens is not None:
        room = min(room, seq.params.max_tokens - len(seq.output_token_ids) - 1)
    return max(0, min(k, room))


class Speculator:
    """``draft``: a ``draft_model.DraftProposer`` for the draft_model method, a
    ``hidden_drafter.HiddenStateProposer`` for eagle3; ``kv``: the engine's ``KVCacheManager`` (a draft's positions
    are allocated before it drafts)."""

    def __init__(self, method: SpeculativeMethod, kv=None, draft=None):
        self.method = method
        self.k = method.num_speculative_tokens
        self.kv = kv
        self.draft = draft
        # the drafts looked up in the tokens so far (ngram: the request's own; suffix: also earlier outputs), or None
        # for a draft model
        self.lookup = None
        if method.method == "ngram":
            self.lookup = NgramProposer(method.prompt_lookup_min, method.prompt_lookup_max)
        elif method.method == "suffix":
            self.lookup = SuffixProposer(method.suffix_max_tree_depth, method.suffix_max_cached_requests,
                                         method.suffix_max_spec_factor, method.suffix_min_token_prob)
        self._tracked: dict[str, Sequence] = {}     # suffix: the sequences seen running, whose outputs join its tree
        self.stats = SpecDecodeStats(accepted_per_pos=[0] * self.k, current_k=self.k)
        self.auto = AutoK(self.k) if method.auto_k else None

    def propose(self, running: list[Sequence]) -> None:
        """Set ``spec_drafts`` of every running sequence (empty where it does not draft this step)."""
        limit = self.method.disable_by_batch_size
        drafting = limit is None or len(running) < limit
        k = self.k
        if self.auto is not None and drafting:
            decoding = sum(1 for seq in running if seq.num_tokens - seq.num_computed_tokens == 1)
            k = self.auto.choose(decoding)
            if k != self.stats.current_k:
                log.info("speculative decoding: k %s -> %d for %d decoding sequences (acceptance by position %s)",
                         self.stats.current_k, k, decoding,
                         " ".join(f"{self.auto.acceptance.rate(j):.2f}" for j in range(self.k)))
            self.stats.current_k = k
        drafting = drafting and k > 0
        if isinstance(self.lookup, SuffixProposer):
            self._outputs_of_finished(running)
        wanted = []
        for seq in running:
            seq.spec_drafts, seq.spec_draft_probs = [], None
            if not drafting or seq.pooling is not None or seq.num_tokens - seq.num_computed_tokens != 1:
                continue
            if getattr(seq.grammar, "gating", False):    # a grammar waiting for its reasoning block to end
                continue
            room = draft_room(seq, k)
            if room and self.lookup is not None:
                seq.spec_drafts = self.lookup.propose(seq, room)
            elif room and self._room_in_pool(seq, room, len(running)):
                wanted.append((seq, room))
        if hasattr(self.draft, "retain"):          # a hidden-state drafter keeps the running sequences' rows only
            self.draft.retain(running)
        if wanted:
            self.draft.propose(wanted)
        if self.lookup is not None and self.lookup.num_histories > 2 * len(running) + 16:   # those that left keep none
            self.lookup.retain({seq.seq_id for seq in running})

    def _outputs_of_finished(self, running: list[Sequence]) -> None:
        """The outputs of the sequences that finished since the last step join the suffix method's global tree."""
        now = {seq.seq_id: seq for seq in running}
        for seq_id, seq in self._tracked.items():
            if seq_id not in now and seq.is_finished:
                self.lookup.finished(seq.output_token_ids)
        self._tracked = now

    def _room_in_pool(self, seq: Sequence, room: int, running: int) -> bool:
        """Allocate the blocks of ``seq``'s next 1 + ``room`` positions if the pool keeps a block per running
        sequence beside them."""
        need = self.kv.blocks_needed(seq.num_computed_tokens + 1 + room) - len(seq.block_ids)
        return need <= 0 or (self.kv.num_free_blocks - need >= running and self.kv.allocate(seq, 1 + room))

    def observe_step(self, tokens: int, seconds: float) -> None:
        """A step of decode and draft positions only (no prompt): ``tokens`` computed in ``seconds``."""
        if self.auto is not None:
            self.auto.observe(tokens, seconds)

    def record(self, drafted: int, accepted: int) -> None:
        """One sequence's verification: ``accepted`` of its ``drafted`` tokens kept."""
        if self.auto is not None:
            self.auto.record(drafted, accepted)
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += drafted
        s.num_accepted_tokens += accepted
        for j in range(accepted):
            s.accepted_per_pos[j] += 1
