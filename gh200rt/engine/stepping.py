"""``EngineSteps``: the part of ``LLMEngine`` (engine.py) that runs a step and reports it.

A step is launched (``_launch``: the model and the sampler run without waiting for the device; the step's progress
is counted), later taken in (``_take_in``: its tokens reach the host, sequences advance, stop, detokenize) and
reported (``_report``: each request's ``RequestOutput``). Without async scheduling one ``step()`` does all three in
turn. With it (``run_ahead.py``) a call launches the next step before taking in the one in flight, so the host's
work on a step overlaps the device's on the next; with speculative decoding (whose drafts need the tokens on the
host) and tensor parallelism (whose rank 0 sends its workers the input ids from the host), the next step is
launched once the step is taken in and before it is reported (the text of sequences without stop strings and the
outputs are made while the next step runs). Each call still reports exactly one
step. An embedding request (``PoolingParams``) is prefilled in the same steps and answered once, pooled
(engine/pooling.py). With speculative decoding the engine drafts before it schedules (``speculative/speculator.py``),
a step's drafted positions are verified instead of sampled (``speculative/verify.py``), and each sequence takes in
the tokens verification emits, one by one, its KV progress following the drafts it kept.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from gh200rt.engine.outputs import EmbeddingRequestOutput, RequestOutput
from gh200rt.engine.request_state import prompt_logprobs_for_chunk
from gh200rt.engine.run_ahead import FedTokens, plan_run_ahead, reads_its_output_on_the_host
from gh200rt.engine.sampler import PendingSample
from gh200rt.scheduler.request import Sequence
from gh200rt.scheduler.scheduler import SchedulerOutput
from gh200rt.speculative.verify import launch_verification

# a step with nothing to compute while blocks come from disk waits this long for them before it returns (the
# caller steps again; a request that arrives meanwhile waits no longer than this)
DISK_READ_POLL_SECONDS = 0.05


@dataclass
class LaunchedStep:
    """A step whose model and sampling are launched and whose results are not yet on the host."""
    sampling: list[Sequence]                         # sequences that sample, in row order
    prompt_chunks: dict[int, tuple[Sequence, int]]   # scheduled index -> (sequence, tokens computed before)
    prompt_logits: dict[int, torch.Tensor]           # StepLogits' (the sampled rows' logits are not kept)
    pooled: dict[int, torch.Tensor]
    sample: PendingSample | None
    out: SchedulerOutput
    # a step launched ahead whose sampling waits for the previous step's tokens on the host (a grammar, bad words)
    deferred_logits: torch.Tensor | None = None
    # a verifying step's (speculative decoding): tokens drafted per sequence of ``sampling``
    drafted: list[int] | None = None
    # the step's hidden states a hidden-state drafter reads (``StepLogits.hidden``), or None
    hidden: torch.Tensor | None = None
    launch_seconds: float = 0.0      # the host's time launching it (on the CPU: running it)


@dataclass
class TakenStep:
    """A step taken in: its sequences advanced and stopped, its text made except where reports come late."""
    outputs: list                                   # embedding requests answered
    touched: dict[str, set[int]]                    # request id -> indices of its sequences that advanced
    # (detokenizer, token) pairs whose text is made when the step is reported (``--async-scheduling`` that does not
    # run ahead: only sequences without stop strings, whose stops do not depend on their text)
    untexted: list = field(default_factory=list)


class EngineSteps:
    """Reads and writes the engine's parts (scheduler, runner, sampler, KV manager, requests) and step counters;
    ``_in_flight`` is the step launched ahead, if any, and ``_runs_ahead`` whether async scheduling applies."""

    @property
    def rows_in_flight(self) -> int:
        """Rows of a step launched ahead (``--async-scheduling``) whose tokens no ``step()`` has reported yet."""
        return 0 if self._in_flight is None else len(self._in_flight.sampling)

    @property
    def async_scheduling(self) -> str | None:
        """How a step overlaps the host's work (``--async-scheduling``): "run-ahead" (the next step is launched
        before this one's tokens reach the host), "report" (speculative decoding, tensor parallelism: once they are
        taken in, before the step is reported) or None (synchronous)."""
        return "run-ahead" if self._runs_ahead else "report" if self._reports_late else None

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput | EmbeddingRequestOutput]:
        """Outputs of one step. With ``--async-scheduling`` the step after it may be launched first (``run_ahead.py``):
        then this call reports the step launched by the last one and leaves the next in flight."""
        # tier moves and expert swaps happen between steps: a step launched ahead finishes on the device first
        if self.balancer is not None:
            self.balancer.between_steps(self._settle_in_flight)
        if self.controller is not None:
            self.controller.between_steps(self.tier_signals(), self._settle_in_flight)
        started = time.perf_counter()
        capturing = self.graphs.capture_seconds if self.graphs is not None else 0.0
        self._steps += 1
        current, self._in_flight = self._in_flight, None
        if current is None:
            current = self._launch_next()
            if current is None:
                if self.host_tier is not None and self.host_tier.reading_from_disk:
                    self.host_tier.wait_for_disk_reads(DISK_READ_POLL_SECONDS)   # what waits is those blocks
                return []
        if self._runs_ahead:
            self._in_flight = self._launch_ahead(current)
        if self._reports_late:
            waited = time.perf_counter()
            taken = self._take_in(current, late=True)
            current_seconds = current.launch_seconds + time.perf_counter() - waited
            self._in_flight = self._launch_next()
            self.steps_launched_ahead += self._in_flight is not None
            outputs = self._report(taken)
        else:
            outputs = self._report(self._take_in(current, late=False))
        ahead = self._in_flight
        if ahead is not None and all(item.seq.is_finished for item in ahead.out.scheduled):
            self.rows_discarded += len(ahead.sampling)
            self._in_flight = None           # every sequence in it stopped: nothing to take in or report
        elif ahead is not None and ahead.deferred_logits is not None:   # its rows' outputs are appended now
            ahead.sample = self.sampler.launch(ahead.deferred_logits, ahead.sampling)
            ahead.deferred_logits = None
        # what a running request waits per token; a graph capture is one-off (after a tier move, it
        # must not read as slow steps that call for the next move)
        captured = self.graphs.capture_seconds - capturing if self.graphs is not None else 0.0
        seconds = time.perf_counter() - started - captured
        self._step_seconds += seconds
        if self._reports_late:       # the call also launched the next step: what ``current`` cost is its own
            seconds = current_seconds
        if self.host_tier is not None and current.out.scheduled and not self._runs_ahead \
                and all(item.computes_prompt for item in current.out.scheduled):
            self.host_tier.observe_prompt_step(seconds, current.out.num_batched_tokens)
        if self.speculator is not None and current.out.scheduled \
                and not any(item.computes_prompt for item in current.out.scheduled):
            self.speculator.observe_step(current.out.num_batched_tokens, seconds)
        return outputs

    def _settle_in_flight(self) -> None:
        """Wait until a step launched ahead has run on the device (it is still reported as usual): weights and
        experts move only while no step reads them."""
        if self._in_flight is not None and self._in_flight.sample is not None:
            self._in_flight.sample.wait()

    def _launch_next(self) -> LaunchedStep | None:
        """Draft (speculative decoding), schedule and launch the next step from what the host knows; None when
        nothing is to be computed."""
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        out = self.scheduler.schedule()
        return None if out.is_empty else self._launch(out)

    def _launch(self, out: SchedulerOutput, fed: FedTokens | None = None) -> LaunchedStep:
        """Run the model on ``out`` and sample, without waiting for the device; count the step's progress."""
        now = time.perf_counter()
        capturing = self.graphs.capture_seconds if self.graphs is not None else 0.0
        step = self._launch_step(out, fed)
        captured = self.graphs.capture_seconds - capturing if self.graphs is not None else 0.0
        step.launch_seconds = time.perf_counter() - now - captured
        return step

    def _launch_step(self, out: SchedulerOutput, fed: FedTokens | None) -> LaunchedStep:
        now = time.perf_counter()
        groups = [(item.seq, item.draft_token_ids) for item in out.scheduled if item.samples]
        sampling = [seq for seq, _ in groups]
        prompt_chunks = {i: (item.seq, item.seq.num_computed_tokens) for i, item in enumerate(out.scheduled)}
        for item in out.scheduled:
            metrics = self.requests[item.seq.group_id].metrics
            metrics.first_scheduled_time = metrics.first_scheduled_time or now
        self.iteration_tokens.observe(out.num_batched_tokens)
        logits = self.runner.run(out) if fed is None else self.runner.run(out, fed)
        self._step_tokens += out.num_batched_tokens
        self._step_rows += len(out.scheduled)
        self.scheduler.step_done(out)
        if fed is not None and any(reads_its_output_on_the_host(item.seq) for item in out.scheduled if item.fed):
            return LaunchedStep(sampling, prompt_chunks, logits.prompt_logits, logits.pooled, None, out,
                                deferred_logits=logits.sample_logits)
        if any(drafts for _, drafts in groups):
            sample = launch_verification(self.sampler, logits.sample_logits, groups)
            return LaunchedStep(sampling, prompt_chunks, logits.prompt_logits, logits.pooled, sample, out,
                                drafted=[len(drafts) for _, drafts in groups], hidden=logits.hidden)
        sample = self.sampler.launch(logits.sample_logits, sampling, None if fed is None else fed.in_flight()) \
            if sampling else None
        return LaunchedStep(sampling, prompt_chunks, logits.prompt_logits, logits.pooled, sample, out,
                            hidden=logits.hidden)

    def _launch_ahead(self, current: LaunchedStep) -> LaunchedStep | None:
        """The next step, launched before ``current``'s tokens reach the host, where ``plan_run_ahead`` allows."""
        tokens = current.sample.tokens if current.sample is not None else None
        planned = plan_run_ahead(current.out, current.sampling, tokens, self.scheduler, self.kv)
        if planned is None:
            return None
        self.steps_launched_ahead += 1
        return self._launch(*planned)

    def _take_in(self, step: LaunchedStep, late: bool) -> TakenStep:
        """Bring ``step``'s results to the host: advance its sequences, check stops, detokenize (``late``: only
        the sequences with stop strings; the rest when the step is reported)."""
        prompt_chunks = step.prompt_chunks
        taken = TakenStep(self._pool(step.pooled, prompt_chunks), {})
        touched, untexted = taken.touched, taken.untexted if late else None
        for i, chunk_logits in step.prompt_logits.items():
            seq, start = prompt_chunks[i]
            if seq.is_finished:              # aborted while its step was in flight
                continue
            state = self.requests[seq.group_id]
            if seq.index == 0 and state.prompt_logprobs is not None and len(state.prompt_logprobs) == start + 1:
                state.prompt_logprobs.extend(prompt_logprobs_for_chunk(chunk_logits, seq.prompt_token_ids, start,
                                                                       seq.params.prompt_logprobs))
        if step.sample is not None and step.drafted is not None:
            self._take_verified(step, touched, untexted)
        elif step.sample is not None:
            result = step.sample.result()
            stamp = time.perf_counter()
            for seq, token, lp, chosen in zip(step.sampling, result.token_ids, result.logprobs,
                                              result.chosen_logprobs):
                if seq.is_finished:          # launched ahead, then stopped (or aborted) by the step before
                    self.rows_discarded += 1
                    continue
                seq.first_token_time = seq.first_token_time or stamp
                seq.last_token_time = stamp
                self._advance(seq, token, lp, chosen, untexted)
                touched.setdefault(seq.group_id, set()).add(seq.index)
        if step.hidden is not None and self.speculator is not None:
            self._hand_hidden_states(step)
        return taken

    def _report(self, taken: TakenStep) -> list[RequestOutput | EmbeddingRequestOutput]:
        """Each advanced request's output (its text made first where it was left for now)."""
        for detok, token in taken.untexted:
            detok.add_token(token)          # no stop strings: nothing it makes ends a sequence
        outputs = taken.outputs
        for group_id, advanced in taken.touched.items():
            state = self.requests[group_id]
            outputs.append(state.make_output(advanced))
            if state.finished:
                del self.requests[group_id]
        return outputs

    def _take_verified(self, step: LaunchedStep, touched: dict[str, set[int]], untexted: list | None) -> None:
        """Append what verification emitted for each sequence, token by token (a stop ends it there): before each
        token after the first, the drafted token before it, computed in this step and kept, counts as computed."""
        result = step.sample.result()
        stamp = time.perf_counter()
        row = 0
        for seq, drafted, emitted in zip(step.sampling, step.drafted, result.emitted):
            first, row = row, row + drafted + 1
            if seq.is_finished:              # aborted while its step was in flight
                self.rows_discarded += drafted + 1
                continue
            seq.first_token_time = seq.first_token_time or stamp
            seq.last_token_time = stamp
            for j in range(first, first + emitted):
                if j > first:
                    seq.num_computed_tokens += 1
                self._advance(seq, result.token_ids[j], result.logprobs[j], result.chosen_logprobs[j], untexted)
                if seq.is_finished:
                    break
            if drafted:
                self.speculator.record(drafted, emitted - 1)
            if not seq.is_finished:
                self.kv.publish_full_blocks(seq)
            touched.setdefault(seq.group_id, set()).add(seq.index)

    def _hand_hidden_states(self, step: LaunchedStep) -> None:
        """Give the hidden-state drafter each sequence's rows of the positions it kept: a prompt chunk's all, a
        verification's last token and accepted drafts (the sequence's KV progress has followed them); the rows of
        sequences no longer running are dropped."""
        kept, flat = [], 0
        for i, item in enumerate(step.out.scheduled):
            seq, start = step.prompt_chunks[i]
            rows = min(item.num_new_tokens, seq.num_computed_tokens - start)
            if not seq.is_finished and rows > 0:
                kept.append((seq, start, step.hidden[flat:flat + rows]))
            flat += item.num_new_tokens
        self.speculator.draft.take_hidden(kept)
        self.speculator.draft.retain(self.scheduler.running)     # those that finished keep nothing

    def _pool(self, pooled: dict, prompt_chunks: dict) -> list[EmbeddingRequestOutput]:
        """Add this step's pooled rows to their embedding requests; answer and free those whose input is all in."""
        done = []
        for i, rows_sum in pooled.items():
            seq, start = prompt_chunks[i]
            if seq.is_finished:              # aborted while its step was in flight
                continue
            state = self.requests[seq.group_id]
            state.add_chunk(start, seq.num_computed_tokens, rows_sum)
            if state.finished:
                seq.finish("stop")
                self.scheduler.finish(seq)   # its full blocks stay in the prefix cache
                del self.requests[seq.group_id]
                done.append(state.output())
        return done

    def _advance(self, seq: Sequence, token: int, lp, chosen: float, untexted: list | None) -> None:
        """Append ``token`` and stop where it ends the sequence; its text is made now, or appended to ``untexted``
        for later where no stop string can read it."""
        state = self.requests[seq.group_id]
        seq.append_token(token)
        if seq.grammar is not None:             # the grammar state follows the output tokens exactly
            seq.grammar.accept(token)
        self.generation_tokens += 1
        if lp is not None:
            seq.output_logprobs.append(lp)
            seq.cumulative_logprob += chosen
        if self._runs_ahead:     # a step launched ahead counted this position computed before its token was known
            self.kv.publish_full_blocks(seq)
        finished = seq.check_token_stop(token)
        if not (finished and seq.finish_reason == "stop"):    # EOS and stop token ids add no text
            detok = state.detoks[seq.index]
            if untexted is not None and not detok.stop:
                untexted.append((detok, token))
            else:
                stop = detok.add_token(token)
                if stop is not None:
                    finished = seq.finish("stop", stop)
        if finished:
            self.scheduler.finish(seq)
