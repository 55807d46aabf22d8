"""The Triton attention's per-token (sequence, position) layout, built on the device, equals the host lists."""
import pytest

from gh200rt.kernels.triton.paged_attention import token_layout
from gh200rt.models.base import AttentionMetadata


@pytest.mark.parametrize("query_lens,seq_lens", [([1, 1, 1], [1, 17, 40]), ([7], [7]), ([5, 1, 20], [37, 16, 20])])
def test_token_layout_matches_host_lists(query_lens, seq_lens):
    tables = [[b + 1] * (-(-s // 16)) for b, s in enumerate(seq_lens)]
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, 16)
    seq, pos = token_layout(meta)
    assert seq.tolist() == [b for b, q in enumerate(query_lens) for _ in range(q)]
    assert pos.tolist() == meta.positions().tolist()
    assert token_layout(meta)[0] is seq, "built once per step, shared by every layer"
