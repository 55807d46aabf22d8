"""A tensor-parallel rank's slice of an adapter (gh200rt/lora/tp_shard.py): column-parallel ranks' deltas are the
full delta's rows, row-parallel ranks' partial deltas sum to it; KV split (2 ranks) and replicated (4 ranks)."""
import pytest
import torch

from gh200rt.distributed.sharding import TensorShard
from gh200rt.lora.peft_adapter import read_peft_adapter, target_shapes
from gh200rt.lora.tp_shard import COLUMN_PARALLEL, _column_range, _row_ranges, shard_adapter
from gh200rt.models.arch_config import ArchConfig
from tests.lora.peft_files import write_peft_adapter
from tests.model.tiny_checkpoints import make_hf_model


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_slices_rebuild_the_full_delta(tmp_path, world_size):
    hf = make_hf_model("llama3-gqa-untied")
    arch = ArchConfig.from_hf_config(hf.config.to_dict())
    adapter = read_peft_adapter(write_peft_adapter(str(tmp_path / "a"), hf, r=4, alpha=8, seed=3), arch, 8,
                                torch.float64)
    shards = [TensorShard(rank, world_size, arch) for rank in range(world_size)]
    pieces = [shard_adapter(adapter, shard) for shard in shards]
    for (layer, target), parts in adapter.weights.items():
        fan_in, _ = target_shapes(arch, layer)[target]
        x = torch.randn(5, fan_in, dtype=torch.float64)
        for shard, piece in zip(shards, pieces):
            local_in, local_outs = target_shapes(shard.local_arch(), layer)[target]
            for p, pair in enumerate(piece.weights[(layer, target)]):
                assert pair[0].shape[1] == local_in and pair[1].shape[0] == local_outs[p], (target, p)
        for p, (a, b) in enumerate(parts):
            full = x @ a.T @ b.T
            if target in COLUMN_PARALLEL:
                for shard, piece in zip(shards, pieces):
                    lo, hi = _row_ranges(shard, target)[p]
                    a_r, b_r = piece.weights[(layer, target)][p]
                    torch.testing.assert_close(x @ a_r.T @ b_r.T, full[:, lo:hi], rtol=0, atol=1e-12)
            else:
                total = sum(x[:, slice(*_column_range(shard, target))] @ piece.weights[(layer, target)][p][0].T
                            @ piece.weights[(layer, target)][p][1].T for shard, piece in zip(shards, pieces))
                torch.testing.assert_close(total, full, rtol=0, atol=1e-12)
