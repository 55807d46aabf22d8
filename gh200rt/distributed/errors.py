"""The error a tensor-parallel engine raises when a rank fails."""
from __future__ import annotations

from gh200rt.engine.errors import EngineDeadError


class TensorParallelError(EngineDeadError):
    """A rank died, failed to start or failed in a step: ``rank`` and ``reason`` say which and why."""

    def __init__(self, rank: int | None, reason: str):
        self.rank, self.reason = rank, reason
        where = f"tensor-parallel rank {rank}" if rank is not None else "a tensor-parallel rank"
        super().__init__(f"{where} failed: {reason}; the engine cannot continue (close it and start a new one)")
