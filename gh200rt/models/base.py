"""The contract between models and everything that drives them.

A model is a ``torch.nn.Module`` with::

    forward(input_ids[T], positions[T], meta: AttentionMetadata, kv_caches: list[Tensor]) -> hidden[T, H]
    compute_logits(hidden[N, H]) -> logits[N, V]   (float32)

and ``forward`` spelled out in parts, so that the model runner can act between layers:
``embed(input_ids, positions) -> (hidden, context)``, then, with ``residual = None``, for each ``i``
``hidden, residual = layers[i].forward_deferred(hidden, residual, *context, meta, kv_caches[i])``, then
``final_norm(hidden, residual)``: a layer's output is ``hidden + residual`` (``hidden`` where residual is None), the
add left to the next norm, which fuses it where it can; ``layers[i](hidden, *context, meta, kv_caches[i])`` is one
layer's whole output.

Tokens of all sequences in a step are flattened into one dimension ``T`` (no padding); the
step's layout travels explicitly in ``AttentionMetadata`` (no global forward context).
``kv_caches[i]`` is layer i's paged pool, shape ``[2, num_blocks, block_size, num_kv_heads, head_dim]``
(index 0 = K, 1 = V; latent attention's one plane ``[1, num_blocks, block_size, 1, latent]``: a model's ``arch`` says
``kv_planes``, ``kv_cache_heads`` and ``kv_cache_dim``, kv/pool.py); new K/V for token t are written at flat slot
``slot_mapping[t]`` = ``block_id * block_size + offset`` before attention reads them through ``block_tables``.

Weights reach every linear layer through a ``WeightRef`` (one indirection): a placement points it
at a resident tensor, a view into a staging slot or a host-memory view, and the loader writes
each checkpoint tensor straight into whatever the ref holds. Models are pure: nothing in them
knows where their weights live; the weight store's hooks run in the model runner, between layers.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Layout of one step's flattened batch of B sequences and T tokens."""
    query_start_loc: torch.Tensor   # int64 [B+1]: tokens of sequence b are [qsl[b], qsl[b+1])
    seq_lens: torch.Tensor          # int64 [B]: tokens in the KV cache for b after this step (cached + new)
    block_tables: torch.Tensor      # int32 [B, max_blocks]: physical block ids; padding entries are 0
    slot_mapping: torch.Tensor      # int64 [T]: flat pool slot where token t's K/V are written
    query_lens_list: list[int]      # host copies, so CPU paths never synchronise to read sizes
    seq_lens_list: list[int]
    block_size: int
    # the step's linears in calls of exactly this many rows (layers/row_blocks.py), so that no row's bits depend
    # on the rows beside it (engine/invariance.py says which steps); None: each call as it comes, fastest
    linear_rows: int | None = None
    # every layer's host KV blocks where tables may name them (kv/host_blocks.py ``HostKVLayers``), else None
    host_kv: object = None

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_list)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens_list))

    @property
    def is_decode_only(self) -> bool:
        return all(q == 1 for q in self.query_lens_list)

    @classmethod
    def build(cls, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
              block_size: int, device: torch.device | str = "cpu") -> "AttentionMetadata":
        """From per-sequence host lists; each sequence's new tokens are its last ``query_len`` positions."""
        assert len(query_lens) == len(seq_lens) == len(block_tables)
        starts = [0]
        slots: list[int] = []
        for q, s, table in zip(query_lens, seq_lens, block_tables):
            assert 0 < q <= s and len(table) * block_size >= s, (q, s, len(table))
            starts.append(starts[-1] + q)
            slots.extend(table[p // block_size] * block_size + p % block_size for p in range(s - q, s))
        width = max((len(t) for t in block_tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in block_tables]
        return cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(padded), width),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_lens_list=list(query_lens), seq_lens_list=list(seq_lens), block_size=block_size)

    def positions(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Absolute position of every new token (int64 [T])."""
        pos = [p for q, s in zip(self.query_lens_list, self.seq_lens_list) for p in range(s - q, s)]
        return torch.tensor(pos, dtype=torch.int64, device=device)

_REF_VERSIONS = itertools.count(1)


class WeightRef:
    """Where a linear layer reads its weight now: a dense ``[out, in]`` tensor or a packed quantized weight.

    A placement repoints ``current``; the layer never caches it. ``shape`` and ``dtype`` describe the
    logical dense weight whatever the storage. A packed (quantized) weight is any object with
    ``linear(x, bias) -> Tensor`` and ``nbytes``; a linear layer computes
    ``F.linear(x, current, bias)`` for a tensor and ``current.linear(x, bias)`` otherwise.
    ``version`` changes with every assignment to ``current`` and is never reused in the process, so code that
    derives something from the current weight (the native decode layer's arguments) can key it on the
    version without holding the weight alive.
    """
    __slots__ = ("_current", "version", "shape", "dtype")

    def __init__(self, current, shape: tuple[int, int], dtype: torch.dtype):
        self.current = current
        self.shape = shape
        self.dtype = dtype

    @property
    def current(self):
        return self._current

    @current.setter
    def current(self, weight) -> None:
        self._current = weight
        self.version = next(_REF_VERSIONS)

    @property
    def nbytes(self) -> int:
        cur = self.current
        return cur.nbytes if isinstance(cur, torch.Tensor) else int(cur.nbytes)


def dense_weight(ref: WeightRef, name: str) -> torch.Tensor:
    """The dense tensor ``ref`` holds now (what the loader writes into)."""
    assert isinstance(ref.current, torch.Tensor), f"{name}: the loader writes dense weights only"
    return ref.current
