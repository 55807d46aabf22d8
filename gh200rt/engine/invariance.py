"""Which steps compute their linears in fixed row blocks (``models/layers/row_blocks.py``), and why.

**Prefix-cache invariance (always, on the CPU).** A prompt position must compute the same bits however its prompt
was split: all at once, after blocks from the prefix cache, in prefill chunks of any size, beside any other
requests. So every step that computes a prompt position runs its linears in blocks of ``PROMPT_BLOCK_ROWS`` rows
and its logits head in blocks of ``LOGIT_BLOCK_ROWS``, or in the larger blocks each was found to give the same
bits at (``models/layers/row_blocks.py``: probed once per linear route and process), or, for a step of fewer
rows (a turn's new tokens after its cached history), the smallest smaller block found to give them; attention is the native
kernels' (a query's bits depend on its own row and keys only, decode and multi-token alike). A step of decodes
only keeps each route's fastest forms (the native few-row linears, a GGUF checkpoint's blocks for one row, the
one-call decoder layer, the bucketed decode path), whose bits are not the blocks' — so the prefix cache publishes
only blocks of prompt positions (``kv/kv_manager.py``): a cached block always holds what a prefill computes.

**Batch invariance (``--batch-invariant``, the CPU only).** Every step, decodes too, runs its linears in blocks
of ``BATCH_INVARIANT_BLOCK_ROWS`` rows, so a sequence's tokens do not depend on which requests share its steps;
decoded blocks are published again (they now hold a prefill's bits).

A GPU step keeps its kernels as they are: its attention takes other kernels for decodes, short chunks and
prompts (``backends/cuda/ops.py``), which row blocks do not make agree (docs/BENCHMARKS.md says what is left).
"""
from __future__ import annotations

from gh200rt.scheduler.scheduler import SchedulerOutput

# Rows per linear call in a step that computes prompt positions: enough for oneDNN's AMX kernels and fbgemm to
# run near their best (a step of fewer rows takes a smaller block where the probe keeps its bits: a prompt's last
# tokens after a cached prefix; docs/BENCHMARKS.md, prefix-cache invariance).
PROMPT_BLOCK_ROWS = 64
# Rows per logits-head call in such a step: a step samples a row per sequence, usually a few.
LOGIT_BLOCK_ROWS = 8
# The largest logits-head call such a step makes, where the probe finds it keeps the 8 rows' bits (prompt logprobs,
# many sequences' prompts in one step): 256 rows of a 128k vocabulary are 128 MiB of float32 logits.
LOGIT_MAX_BLOCK_ROWS = 256
# Rows per linear call in every step of a batch-invariant engine: a decode step of one sequence pays for this many.
BATCH_INVARIANT_BLOCK_ROWS = 16


def linear_block_rows(out: SchedulerOutput, batch_invariant: bool) -> int | None:
    """The rows per linear call of step ``out`` on the CPU (``AttentionMetadata.linear_rows``); None: as fast as
    each call can."""
    if batch_invariant:
        return BATCH_INVARIANT_BLOCK_ROWS
    if any(item.computes_prompt for item in out.scheduled):
        return PROMPT_BLOCK_ROWS
    return None
