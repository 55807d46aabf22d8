"""Turn one step's logits into tokens for the whole batch with tensor ops, on the logits' device.

Order: min_tokens mask -> repetition / presence / frequency penalties -> greedy argmax, or
temperature -> top-k -> top-p -> min-p -> draw. A draw inverts the row's cumulative distribution
at one uniform number (a cumsum and a binary search: ~25x cheaper than drawing noise for every
vocabulary entry). Unseeded rows take their uniforms in one call on the engine's generator for that
device; a seeded row draws from its sequence's own generator on the same device, so its tokens do
not depend on what else is in the batch. Logprobs are of the model's raw distribution
(log_softmax of the logits). The host sees the step's results in one device -> host copy, issued at once
(``launch``) and read when wanted (``PendingSample.result``): an engine that launches the next step in between
reads this step's tokens on the device (``PendingSample.tokens``) without waiting for them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gh200rt.engine.device_inputs import to_device, to_host
from gh200rt.engine.logits_processors import apply_logits_processors
from gh200rt.engine.outputs import Logprob, TokenLogprobs
from gh200rt.engine.penalties import apply_penalties, needs_penalties
from gh200rt.engine.sampling_tensors import SamplingTensors, banned_until_min_tokens, mask_ids
from gh200rt.scheduler.request import Sequence


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]     # per row; None when the request asked for none
    chosen_logprobs: list[float]
    # a verification step's (speculative/verify.py): tokens each verified sequence emits, from its first row on
    emitted: list[int] | None = None


# On the CPU, top-k / top-p look at each row's largest WINDOW logits (a partial top-k, not a sort of
# the vocabulary); a top-p row whose window holds less than top_p of the mass tries the WIDE_WINDOW, then a sort
# (at 64 rows of 49,152 ids on 2 CPUs: 4.9 ms for the largest 256, 16 ms for 4,096, 89 ms for the sort).
WINDOW = 256
WIDE_WINDOW = 4096


def truncate_batch(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """``logits`` [R, V] (temperature-scaled) with what top-k, top-p and min-p exclude set to -inf."""
    if t.any_top_k or t.any_top_p:
        logits = _top_k_top_p(logits, t)
    if t.any_min_p:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < t.min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return logits


def _top_k_top_p(logits: torch.Tensor, t: SamplingTensors, window: int = WINDOW) -> torch.Tensor:
    if logits.device.type != "cpu" or logits.shape[1] <= window or t.max_top_k > window:
        return _sorted_top_k_top_p(logits, t)
    head, covered = _window_top_k_top_p(logits, t, window)
    if bool(covered.all()):
        return head
    rows = (~covered).nonzero().squeeze(1)
    wider = _top_k_top_p(logits.index_select(0, rows), t.select(rows), WIDE_WINDOW) if window < WIDE_WINDOW else \
        _sorted_top_k_top_p(logits.index_select(0, rows), t.select(rows))
    return head.index_copy(0, rows, wider)


def _kth_largest(sorted_head: torch.Tensor, top_k: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, 1]: each row's k-th largest logit, or -inf where top-k is off."""
    on = (top_k > 0) & (top_k < vocab)
    index = torch.where(on, top_k - 1, 0).clamp(max=sorted_head.shape[1] - 1).unsqueeze(1)
    return torch.where(on.unsqueeze(1), sorted_head.gather(1, index), float("-inf"))


def _sorted_top_k_top_p(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    neg_inf = float("-inf")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    if t.any_top_k:
        kth = _kth_largest(sorted_logits, t.top_k, logits.shape[1])
        logits = logits.masked_fill(logits < kth, neg_inf)            # ties with the k-th value stay
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, neg_inf)
    if t.any_top_p:
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = (before >= t.top_p.unsqueeze(1)) & (t.top_p < 1.0).unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)  # smallest prefix reaching top_p
        logits = logits.masked_fill(drop, neg_inf)
    return logits


def _window_top_k_top_p(logits: torch.Tensor, t: SamplingTensors, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k / top-p from each row's largest ``window`` logits; ``covered[r]`` is False where top-p needs more."""
    neg_inf = float("-inf")
    # top-k alone needs each row's k-th largest only: the largest k of the batch's, not the window (half the time)
    head, ids = torch.topk(logits, window if t.any_top_p else t.max_top_k, dim=-1)
    if t.any_top_k:
        kth = _kth_largest(head, t.top_k, logits.shape[1])
        logits = logits.masked_fill(logits < kth, neg_inf)
        head = head.masked_fill(head < kth, neg_inf)
    covered = torch.ones(logits.shape[0], dtype=torch.bool)
    if t.any_top_p:
        probs = torch.exp(head - torch.logsumexp(logits, dim=-1, keepdim=True))
        mass = torch.cumsum(probs, dim=-1)
        active = (t.top_p < 1.0).unsqueeze(1)
        keep_head = ~((mass - probs) >= t.top_p.unsqueeze(1))
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, ids, keep_head)
        logits = logits.masked_fill(~keep & active, neg_inf)           # beyond the window: past top_p mass
        covered = (mass[:, -1] >= t.top_p) | (t.top_p >= 1.0)
    return logits, covered


def truncate(row: torch.Tensor, top_k: int, top_p: float, min_p: float) -> None:
    """One temperature-scaled row [V], truncated in place (``truncate_batch`` on a batch of one)."""
    t = SamplingTensors(torch.zeros(1, dtype=torch.int64), torch.ones(1, 1), torch.tensor([top_k]),
                        torch.tensor([top_p]), torch.tensor([min_p]), bool(top_k), top_p < 1.0, min_p > 0.0, top_k)
    row.copy_(truncate_batch(row.unsqueeze(0), t)[0])


class Sampler:
    def __init__(self, seed: int = 0):
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """The engine's generator for unseeded rows on ``device``."""
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        return self.launch(logits, seqs).result()

    def launch(self, logits: torch.Tensor, seqs: list[Sequence],
               in_flight: tuple[list[int], torch.Tensor] | None = None) -> PendingSample:
        """Sample every row on the logits' device and start the results' copy to the host, without waiting.
        ``in_flight``: (rows, their latest output tokens), tokens the device holds only (a step launched ahead,
        engine/run_ahead.py); penalties and min_tokens count each as its row's latest."""
        assert logits.shape[0] == len(seqs)
        ahead = set(in_flight[0]) if in_flight is not None else set()
        want_logprobs = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        raw_logprobs = None     # [len(want_logprobs), V]: only the rows that report logprobs
        if want_logprobs:
            rows = logits if len(want_logprobs) == len(seqs) else \
                logits.index_select(0, to_device(want_logprobs, torch.int64, logits.device))
            raw_logprobs = torch.log_softmax(rows, dim=-1)
        apply_logits_processors(logits, seqs)       # logit_bias, grammar masks: after raw logprobs, before sampling
        if all(_is_plain_greedy(s, i in ahead) for i, s in enumerate(seqs)):
            tokens = greedy_tokens(logits)
        else:
            tokens = self._sample(logits.clone(), seqs, in_flight)
        return PendingSample.launch(tokens, raw_logprobs, seqs, want_logprobs)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence],
                in_flight: tuple[list[int], torch.Tensor] | None = None) -> torch.Tensor:
        apply_output_rules(logits, seqs, in_flight)
        random_rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if not random_rows:
            return greedy_tokens(logits)
        t, probs = target_probs(logits, seqs, random_rows)
        drawn = draw(probs, self.uniforms(seqs, random_rows, logits.device))
        if len(random_rows) == len(seqs):
            return drawn
        return greedy_tokens(logits).index_copy_(0, t.random_rows, drawn)

    def uniforms(self, seqs: list[Sequence], rows: list[int], device: torch.device) -> torch.Tensor:
        """One uniform number in (0, 1] per row: the engine's generator for unseeded rows, the sequence's own for
        seeded ones."""
        u = torch.zeros(len(rows), device=device)
        seeded = [j for j, i in enumerate(rows) if seqs[i].seed is not None]
        if len(seeded) < len(rows):
            u.uniform_(generator=self.generator(device))
        for j in seeded:
            u[j:j + 1].uniform_(generator=seqs[rows[j]].generator_on(device))
        return 1.0 - u


def apply_output_rules(logits: torch.Tensor, seqs: list[Sequence],
                       in_flight: tuple[list[int], torch.Tensor] | None = None) -> None:
    """What a row's output so far decides, in place: min_tokens' banned ids, then the penalties."""
    ahead = set(in_flight[0]) if in_flight is not None else set()
    banned = {i: ids for i, s in enumerate(seqs) if (ids := banned_until_min_tokens(s, i in ahead))}
    if banned:
        mask_ids(logits, list(banned), list(banned.values()))
    penalised = [i for i, s in enumerate(seqs) if needs_penalties(s)]
    if penalised:
        apply_penalties(logits, seqs, penalised, in_flight)


def target_probs(logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> tuple[SamplingTensors, torch.Tensor]:
    """The distributions ``rows`` (those that draw at random) draw from: temperature, then top-k, top-p, min-p."""
    t = SamplingTensors.build(seqs, rows, logits.device)
    every_row = len(rows) == len(seqs)     # then no row is greedy, and no row need be picked out
    scaled = truncate_batch((logits if every_row else logits.index_select(0, t.random_rows)) / t.temperature, t)
    return t, torch.softmax(scaled, dim=-1)


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One id per row of ``probs`` [R, V] (not necessarily normalised), at ``u`` [R] in (0, 1]: u scaled to the row's
    total, the first index whose cumulative sum reaches it (it has probability > 0)."""
    cdf = probs.cumsum(dim=-1)
    return torch.searchsorted(cdf, u.unsqueeze(1) * cdf[:, -1:]).squeeze(1).clamp_(max=cdf.shape[1] - 1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``argmax(logits, -1)``: on the CPU through ``max``, which picks the same index (the first maximum, a NaN
    before any number) 2.6x faster there (0.79 against 2.08 ms for 64 rows of a 49152-token vocabulary, 2 threads:
    torch's argmax kernel does not vectorise)."""
    if logits.is_cpu:
        return logits.max(dim=-1).indices
    return torch.argmax(logits, dim=-1)


def pack_logprobs(logprobs: torch.Tensor, chosen_ids: torch.Tensor, k: int) -> torch.Tensor:
    """float64 ``[R, 2 + 2k]`` on the device: chosen logprob, its rank, top-k logprobs, top-k ids."""
    chosen = logprobs.gather(1, chosen_ids.unsqueeze(1))
    rank = (logprobs > chosen).sum(dim=1, keepdim=True) + 1
    top_values, top_ids = torch.topk(logprobs, k, dim=-1)
    return torch.cat([chosen.double(), rank.double(), top_values.double(), top_ids.double()], dim=1)


def unpack_logprobs(row: list[float], chosen_id: int, k: int, wanted: int) -> TokenLogprobs:
    """One packed row (see ``pack_logprobs``) as ``{token id: Logprob}``: the top ``wanted``, then the chosen."""
    result: TokenLogprobs = {int(t): Logprob(v, r) for r, (v, t) in
                             enumerate(zip(row[2:2 + wanted], row[2 + k:2 + k + wanted]), start=1)}
    result[chosen_id] = Logprob(row[0], int(row[1]))
    return result


def token_logprobs(logprobs: torch.Tensor, chosen_ids: list[int], k: int) -> list[TokenLogprobs]:
    """Top-``k`` and chosen logprobs of each row of ``logprobs`` [R, V], in one device -> host copy."""
    chosen = to_device(chosen_ids, torch.int64, logprobs.device)
    rows = pack_logprobs(logprobs, chosen, k).tolist()
    return [unpack_logprobs(row, c, k, k) for row, c in zip(rows, chosen_ids)]


class PendingSample:
    """One step's sampled tokens on the device, their logprobs packed beside them, and the copy of both to the
    host in flight. ``tokens`` (int64 [R]) is what a step launched before ``result()`` reads as its input ids."""

    def __init__(self, tokens: torch.Tensor, host: torch.Tensor, landed, raw_logprobs: torch.Tensor | None,
                 seqs: list[Sequence], want: list[int], k: int, num_emitted: int = 0):
        """``raw_logprobs``: the rows of ``want``, kept only where a row pinned its own logprob token ids (read at
        ``result``); ``num_emitted``: how many emitted counts follow the tokens in ``host``."""
        self.tokens = tokens
        self._host, self._landed = host, landed
        self._raw_logprobs, self._seqs, self._want, self._k = raw_logprobs, seqs, want, k
        self._num_emitted = num_emitted

    @classmethod
    def launch(cls, tokens: torch.Tensor, raw_logprobs: torch.Tensor | None, seqs: list[Sequence],
               want: list[int], emitted: torch.Tensor | None = None) -> "PendingSample":
        """Token ids, and the logprobs asked for, packed into one tensor whose host copy starts now. ``raw_logprobs``
        holds the rows of ``want``, in that order; ``emitted`` (int64, a verification step's) goes with them."""
        counts = [] if emitted is None else [emitted]
        if raw_logprobs is None:
            if emitted is None:
                return cls(tokens, *to_host(tokens), None, seqs, want, 0)
            return cls(tokens, *to_host(torch.cat([tokens, emitted])), None, seqs, want, 0, len(emitted))
        chosen = tokens if len(want) == len(seqs) else tokens.index_select(0, to_device(want, torch.int64,
                                                                                        tokens.device))
        k = max(_top_wanted(seqs[i]) for i in want)
        packed = pack_logprobs(raw_logprobs, chosen, k)
        pinned = any(seqs[i].params.logprob_token_ids for i in want)    # read at result(): keep the logprobs
        host = torch.cat([tokens.double(), *(c.double() for c in counts), packed.flatten()])
        return cls(tokens, *to_host(host), raw_logprobs if pinned else None, seqs, want, k,
                   0 if emitted is None else len(emitted))

    def wait(self) -> None:
        """Until the copy has landed: the step's kernels, the sampler's last, have all run."""
        if self._landed is not None:
            self._landed.synchronize()

    def result(self) -> SampleResult:
        """The host's view, once the copy has landed (waits for it)."""
        self.wait()
        seqs, want, k = self._seqs, self._want, self._k
        host = self._host.tolist()
        r, e = len(seqs), self._num_emitted
        emitted = [int(x) for x in host[r:r + e]] if e else None
        if not want:
            return SampleResult([int(x) for x in host[:r]], [None] * r, [0.0] * r, emitted)
        token_ids = [int(x) for x in host[:len(seqs)]]
        width = 2 + 2 * k
        row_logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
        chosen_logprobs = [0.0] * len(seqs)
        for j, i in enumerate(want):
            row = host[r + e + j * width:r + e + (j + 1) * width]
            row_logprobs[i] = unpack_logprobs(row, token_ids[i], k, _top_wanted(seqs[i]))
            chosen_logprobs[i] = row[0]
        for j, i in enumerate(want):
            if seqs[i].params.logprob_token_ids:
                row_logprobs[i].update(pinned_logprobs(self._raw_logprobs[j], seqs[i].params.logprob_token_ids))
        return SampleResult(token_ids, row_logprobs, chosen_logprobs, emitted)


def _top_wanted(seq: Sequence) -> int:
    """How many of the most likely tokens a row reports: none where it pinned its own ids (vLLM's rule)."""
    return 0 if seq.params.logprob_token_ids else seq.params.logprobs


def pinned_logprobs(logprobs: torch.Tensor, token_ids: list[int]) -> TokenLogprobs:
    """``{token id: Logprob}`` of exactly ``token_ids`` in one row [V] of logprobs, ranks included."""
    ids = to_device(token_ids, torch.int64, logprobs.device)
    values = logprobs.index_select(0, ids)
    ranks = (logprobs.unsqueeze(0) > values.unsqueeze(1)).sum(dim=1) + 1
    host = torch.stack([values.double(), ranks.double()]).tolist()
    return {t: Logprob(v, int(r)) for t, v, r in zip(token_ids, host[0], host[1])}


def _is_plain_greedy(seq: Sequence, in_flight: bool = False) -> bool:
    p = seq.params
    return p.greedy and not needs_penalties(seq) and len(seq.output_token_ids) + in_flight >= p.min_tokens
