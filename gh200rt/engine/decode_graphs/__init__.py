"""Decode steps replayed from CUDA graphs, one per batch bucket, with every weight placement.

Contract: ``DecodeGraphRunner.handles(out)`` says whether a scheduled step may run bucketed (every
sequence decodes one token and samples it, and the batch fits the largest bucket);
``run(out)`` fills the persistent input buffers (``DecodeBuffers``), pads the batch to its bucket
(padding rows write no KV and touch no real row) and returns the final hidden states of the real
rows. Prefill and mixed steps stay eager; the sampler and the logits run outside the graph.

The same bucketed, padded, persistent-buffer path runs on the CPU, where "capture" records what a
CUDA capture would (addresses, a capture count) and "replay" calls the same forward on the same
buffers; only the capture itself (``backends/cuda/graph_capture.py``) is CUDA-specific. Graphs are captured
lazily, the first time a bucket runs, and all of them again after the weight store's placement
changes (``WeightStore.plan_version``). DESIGN.md invariant 3: the addresses a graph saw are
recorded at capture (``addresses.py``) and, with ``--check-graph-addresses``, checked before
every replay.
"""
from gh200rt.engine.decode_graphs.addresses import GraphAddressChanged
from gh200rt.engine.decode_graphs.buckets import bucket_for, graph_buckets
from gh200rt.engine.decode_graphs.decode_buffers import DecodeBuffers
from gh200rt.engine.decode_graphs.runner import DecodeGraphRunner, decode_graphs, graphs_missing, reserve_graph_pool

__all__ = ["DecodeBuffers", "DecodeGraphRunner", "GraphAddressChanged", "bucket_for", "decode_graphs", "graph_buckets",
           "graphs_missing",
           "reserve_graph_pool"]
