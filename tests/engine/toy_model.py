"""A one-layer paged-attention model that follows gh200rt.models.base, for fast engine tests.

Not a stand-in for the real models (the acceptance tests use SmolLM2 and a random Llama); it
lets engine mechanics (KV writes through slot_mapping, reads through block tables) be tested
in milliseconds.
"""
from dataclasses import dataclass

import torch

from gh200rt.models.layers.row_blocks import in_row_blocks
from tests.engine.arch_doubles import HeadsKvLayout


@dataclass
class ToyArch(HeadsKvLayout):
    vocab_size: int = 64
    hidden: int = 16
    num_layers: int = 1
    num_kv_heads: int = 1
    head_dim: int = 16
    max_position_embeddings: int = 256

    @property
    def hidden_size(self) -> int:
        return self.hidden


class ToyTokenizer:
    eos_token_ids = [0]

    def encode(self, text):
        return [1 + (ord(c) % 60) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + (i % 26)) for i in ids if not (skip_special_tokens and i == 0))


class ToyModel(torch.nn.Module):
    def __init__(self, arch: ToyArch, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.arch = arch
        self.embed = torch.nn.Parameter(torch.randn(arch.vocab_size, arch.hidden, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(arch.max_position_embeddings, arch.hidden, generator=g) * 0.3)
        self.wq, self.wk, self.wv = (torch.nn.Parameter(torch.randn(arch.hidden, arch.hidden, generator=g) * 0.5)
                                     for _ in range(3))

    def forward(self, input_ids, positions, meta, kv_caches):
        """Honours the step's ``meta.linear_rows`` as the real models do (engine/invariance.py): a BLAS call sums a
        row in an order chosen by the call's row count (MKL's AVX2 kernels by rows mod 6), so projections of a
        prompt position computed after a cached prefix would otherwise differ from a full prefill's in the last bit.
        Attention is computed one query at a time over its own keys, as the native kernels do."""
        x = self.embed[input_ids] + self.pos[positions]
        cache = kv_caches[0]
        flat_k = cache[0].view(-1, self.arch.hidden)
        flat_v = cache[1].view(-1, self.arch.hidden)
        flat_k[meta.slot_mapping] = self._project(x, self.wk, meta.linear_rows)
        flat_v[meta.slot_mapping] = self._project(x, self.wv, meta.linear_rows)
        q = self._project(x, self.wq, meta.linear_rows)
        out = torch.empty_like(x)
        bs = meta.block_size
        for b, (ql, sl) in enumerate(zip(meta.query_lens_list, meta.seq_lens_list)):
            start = int(meta.query_start_loc[b])
            table = meta.block_tables[b, : -(-sl // bs)].long()
            slots = (table[:, None] * bs + torch.arange(bs)).reshape(-1)[:sl]
            k, v = flat_k[slots], flat_v[slots]
            for i in range(ql):             # query i sees keys [0, sl - ql + i]: its own shape, whatever the chunk
                seen = sl - ql + i + 1
                scores = q[start + i:start + i + 1] @ k[:seen].T / 4.0
                out[start + i:start + i + 1] = torch.softmax(scores, -1) @ v[:seen]
        return x + out

    @staticmethod
    def _project(x, weight, rows):
        return x @ weight if rows is None else in_row_blocks(lambda block: block @ weight, x, rows)

    def compute_logits(self, hidden):
        return (hidden @ self.embed.T).float()
