"""Continuous batching over a paged KV cache: ``Sequence`` (request.py) and ``Scheduler``
(scheduler.py). Pure Python and hardware-agnostic (DESIGN.md invariant 2)."""
