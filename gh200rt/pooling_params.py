"""Per-request parameters of an embedding request (vLLM's ``PoolingParams``), validated once.

How the hidden states are pooled (last token or mean) is the engine's ``--pooling-type``, as in
vLLM where it is the model's pooler configuration; a request chooses only whether the pooled
vector is L2-normalised and may name the dimensions it expects.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolingParams:
    normalize: bool = True               # L2-normalise the pooled vector (vLLM's embed default)
    dimensions: int | None = None        # must equal the model's hidden size: these models cannot truncate

    def __post_init__(self):
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, got {self.normalize!r}")
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")

    def check_dimensions(self, hidden_size: int) -> None:
        if self.dimensions is not None and self.dimensions != hidden_size:
            raise ValueError(f"dimensions is {self.dimensions} but this model's embeddings have {hidden_size}: it "
                             f"was not trained to shorten them (Matryoshka), so it cannot; leave dimensions out "
                             f"or give {hidden_size}")
