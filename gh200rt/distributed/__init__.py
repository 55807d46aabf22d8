"""Tensor parallelism over torch.distributed: one model sharded across N ranks (docs/TENSOR_PARALLEL.md).

Rank 0 is the engine's own process: it owns the scheduler, KV block manager, sampler and detokenizer, and each
step sends the step's inputs (``engine/model_runner.HostStep``) to the N-1 worker processes on a gloo control
group. Every rank runs its shard (``sharding.py``, ``sharded_model.py``): column-parallel q/k/v and gate/up,
row-parallel o and down with one all-reduce each, a vocab-parallel embedding and LM head whose logits are gathered
on rank 0 — on the data group (gloo on the CPU, NCCL on GPUs). Workers decide nothing (``worker.py``). A worker
that dies or fails to start makes the engine raise ``TensorParallelError`` naming the rank and the reason
(``workers.py``); ``close`` stops every worker. An engine with one rank creates no process group.
"""
