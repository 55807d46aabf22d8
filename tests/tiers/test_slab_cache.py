"""Quantized host slabs kept between runs (``--host-weight-cache-dir``, weights/slab_cache.py): the second start
reads every slab back instead of quantizing, with the same bytes and the same tokens; a changed checkpoint, a
changed layout or a short file is a miss that quantizes again, never a wrong slab."""
import os

import pytest
import torch

from tests.tiers.test_engine_placement import engine, run, tiny_dir  # noqa: F401 (fixture)
from tests.tiers.test_moe_placement import moe_dir  # noqa: F401 (fixture)

LAYERS = 6


def slab_bytes(eng) -> dict:
    slabs = {f"layer-{i}": s for i, s in eng.store.slabs.items()}
    slabs.update({f"experts-{i}": s.slab for i, s in eng.store.expert_slabs.items()})
    return {name: s.tensor[:s.layout.nbytes].clone() for name, s in slabs.items()}


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_restart_reads_the_slabs_back(tiny_dir, tmp_path, fmt):  # noqa: F811
    options = dict(offload="stream", host_weight_dtype=fmt, host_weight_cache_dir=str(tmp_path))
    first = engine(tiny_dir, **options)
    cache = first.store.slab_cache
    assert (cache.hits, cache.misses) == (0, LAYERS) and len(list(cache.dir.glob("layer-*.slab"))) == LAYERS
    want_tokens, want_bytes = run(first), slab_bytes(first)
    first.close()
    second = engine(tiny_dir, **options)
    cache = second.store.slab_cache
    assert (cache.hits, cache.misses) == (LAYERS, 0) and cache.bytes_read == sum(b.numel() for b in want_bytes.values())
    got = slab_bytes(second)
    assert all(torch.equal(got[name], want_bytes[name]) for name in want_bytes)
    assert run(second) == want_tokens
    second.close()


def test_a_changed_checkpoint_or_a_damaged_entry_quantizes_again(tiny_dir, tmp_path):  # noqa: F811
    options = dict(offload="stream", host_weight_dtype="int8", host_weight_cache_dir=str(tmp_path))
    first = engine(tiny_dir, **options)
    want, directory = run(first), first.store.slab_cache.dir
    first.close()
    with open(directory / "layer-2.slab", "r+b") as f:      # a write cut short
        f.truncate(100)
    (directory / "layer-4.json").write_text('{"nbytes": 1, "parts": []}')
    again = engine(tiny_dir, **options)
    assert (again.store.slab_cache.hits, again.store.slab_cache.misses) == (LAYERS - 2, 2)
    assert run(again) == want
    again.close()
    weights = next(p for p in os.scandir(tiny_dir) if p.name.endswith(".safetensors"))
    os.utime(weights.path, ns=(0, 0))                        # the checkpoint changed: another key
    changed = engine(tiny_dir, **options)
    assert changed.store.slab_cache.dir != directory and changed.store.slab_cache.hits == 0
    changed.close()


def test_expert_slabs_are_kept_too(moe_dir, tmp_path):  # noqa: F811
    options = dict(offload="none", moe_expert_tier="direct", host_weight_dtype="int8",
                   host_weight_cache_dir=str(tmp_path))
    first = engine(moe_dir, **options)
    want_tokens, want_bytes = run(first), slab_bytes(first)
    first.close()
    second = engine(moe_dir, **options)
    assert second.store.slab_cache.hits == 3 and second.store.slab_cache.misses == 0   # three MoE layers
    got = slab_bytes(second)
    assert all(torch.equal(got[name], want_bytes[name]) for name in want_bytes)
    assert run(second) == want_tokens
    second.close()


def test_no_cache_for_formats_that_do_not_quantize(tiny_dir, tmp_path):  # noqa: F811
    eng = engine(tiny_dir, offload="stream", host_weight_cache_dir=str(tmp_path))   # float32: nothing to save
    assert eng.store.slab_cache is None and not any(tmp_path.iterdir())
    eng.close()
