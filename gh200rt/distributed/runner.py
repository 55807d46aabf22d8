"""Rank 0's model runner: each step's inputs go to the workers before rank 0 runs its own shard, with the placement
moves rank 0's store made since the last step (``placement_sync.py``), the host KV tier's copies since then
(``kv/offload.py``) and the step's LoRA slot loads and slots (``worker_lora.py``), and a step that fails because a
worker failed raises ``TensorParallelError`` with that worker's rank and reason."""
from __future__ import annotations

from gh200rt.distributed.errors import TensorParallelError
from gh200rt.distributed.placement_sync import PlacementTracker
from gh200rt.distributed.step_channel import HostKVOps
from gh200rt.distributed.workers import TensorParallelWorkers
from gh200rt.engine.model_runner import ModelRunner, StepLogits
from gh200rt.scheduler.scheduler import SchedulerOutput


class TensorParallelRunner(ModelRunner):
    def __init__(self, workers: TensorParallelWorkers, *args, **kwargs):
        super().__init__(*args, step_sender=self._send, **kwargs)
        self.workers = workers
        self.host_tier = None     # the host KV tier's offloader (rank 0 decides every copy), set by the engine
        self.placement = PlacementTracker(self.hooks) if hasattr(self.hooks, "expert_tiers") else None

    def _send(self, step) -> None:
        if self.lora is not None:      # the adapters this step put in slots, and each sequence's slot
            for _, entry in self.lora.step_loads:
                self.workers.publish_adapter(entry)
            step.lora_loads = [(slot, entry.id) for slot, entry in self.lora.step_loads]
            step.lora_runs = list(self.lora.step_runs)
        self.workers.send_step(step, self.placement.moves() if self.placement is not None else [], self._host_kv_ops())

    def _host_kv_ops(self) -> HostKVOps | None:
        """The host KV tier's copies since the last step, for every worker to repeat on its share of the blocks."""
        if self.host_tier is None:
            return None
        stores, loads = self.host_tier.take_mirror_ops()
        return HostKVOps(self.host_tier.index.num_blocks, stores, loads)

    def run(self, out: SchedulerOutput) -> StepLogits:
        if self.workers.failed is not None:
            raise self.workers.failed
        try:
            return super().run(out)
        except RuntimeError as e:      # a collective failed: a worker is the likely cause
            failure = self.workers.explain(e)
            if failure is None:        # rank 0's own error: the workers are left inside the step, so no step follows
                self.workers.failed = TensorParallelError(0, f"{type(e).__name__}: {e}")
                raise
            raise failure from e
