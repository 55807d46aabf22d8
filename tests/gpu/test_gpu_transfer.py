"""CudaTransferBackend on a real GPU: copies ordered against compute by events (poisoned slots are
never read), eager and under CUDA graph capture, with the counters the engine reports."""
import pytest
import torch

from gh200rt.weights.device_view import prepare_slab_for_device
from gh200rt.numa.alloc import allocate
from gh200rt.transfer.backend import make_transfer_backend
from gh200rt.engine.model_runner import forward
from tests.gpu.gpu_models import Steps, stream_layers, tiny_arch, tiny_model

pytestmark = pytest.mark.gpu

PROMPT = [11, 42, 7, 199, 3, 58, 121]
RINGS = [(1, 0), (2, 1), (3, 1), (3, 2)]  # (slots K, prefetch distance d)


def relative_error(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def test_factory_makes_fixed_cuda_slots(platform):
    from gh200rt.transfer.cuda_backend import CudaTransferBackend
    backend = make_transfer_backend("cuda", 1 << 20, 3, poison=True)
    assert isinstance(backend, CudaTransferBackend)
    assert [(s.device.type, s.dtype, s.numel()) for s in backend.slots] == [("cuda", torch.uint8, 1 << 20)] * 3
    backend.close()


def test_ring_delivers_each_layer_in_order(platform):
    layers = []
    for i in range(6):
        slab = allocate(8 << 20, node=None, policy="default")
        slab.tensor.copy_(torch.randint(0, 255, (8 << 20,), dtype=torch.uint8))
        prepare_slab_for_device(slab, platform)
        layers.append(slab)
    backend = make_transfer_backend("cuda", 8 << 20, 2, poison=True)
    backend.time_waits = True
    sums = []
    backend.copy(0, layers[0].tensor)
    for pos in range(6):
        if pos + 1 < 6:
            backend.copy((pos + 1) % 2, layers[pos + 1].tensor)
        backend.wait_copy(pos % 2)
        sums.append(backend.slots[pos % 2].to(torch.int64).sum())  # a reader on the compute stream
        backend.compute_done(pos % 2)
    torch.cuda.synchronize()
    assert [int(s) for s in sums] == [int(slab.tensor.to(torch.int64).sum()) for slab in layers]
    assert backend.bytes_copied == 6 * (8 << 20)
    assert backend.wait_seconds >= 0.0
    backend.close()


def test_pageable_source_is_refused():
    backend = make_transfer_backend("cuda", 4096, 1, poison=False)
    with pytest.raises(ValueError, match="prepare_slab_for_device"):
        backend.copy(0, torch.zeros(4096, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("slots,distance", RINGS, ids=[f"K{k}-d{d}" for k, d in RINGS])
def test_streamed_forward_matches_all_resident(platform, dtype, slots, distance):
    arch = tiny_arch()
    ids, want = Steps(tiny_model(arch, dtype, "cuda"), "cuda").greedy(PROMPT, 4)
    model = tiny_model(arch, dtype, "cuda")
    backend, _, schedule = stream_layers(model, list(range(arch.num_layers)), platform, slots, distance, poison=True)
    got = Steps(model, "cuda", hooks=schedule).forced(ids, len(PROMPT))
    torch.cuda.synchronize()
    err = relative_error(got, want)
    print(f"streamed K={slots} d={distance} {dtype}: worst relative logit error {err:.2e}")
    assert not got.isnan().any(), "a layer read its staging slot before the copy landed (poison)"
    assert err < (1e-5 if dtype == torch.float32 else 1e-2)
    assert backend.bytes_copied > 0
    backend.close()


def captured_decode_step(platform, layers: list[int]):
    """A tiny model with ``layers`` streamed (K=2, d=1, poisoned slots), its prompt already prefilled:
    (backend, step, want) where ``step()`` decodes one token eagerly and ``want`` is what all-resident
    computes for it. ``step`` has been warmed up on a side stream, as torch.cuda.graph asks. A captured
    step is self-contained, so its ring does not prefetch across steps."""
    arch = tiny_arch()
    resident = Steps(tiny_model(arch, torch.float32, "cuda"), "cuda")
    model = tiny_model(arch, torch.float32, "cuda")
    backend, _, schedule = stream_layers(model, layers, platform, slots=2, distance=1, poison=True, wrap_steps=False)
    streamed = Steps(model, "cuda", hooks=schedule)
    ids = PROMPT + [17]
    resident.run(PROMPT, len(PROMPT))
    streamed.run(PROMPT, len(PROMPT))
    want = resident.run(ids, 1)
    meta = streamed.meta(1, len(ids))
    tokens, positions = torch.tensor(ids[-1:], device="cuda"), meta.positions("cuda")

    @torch.inference_mode()
    def step():
        return model.compute_logits(forward(model, tokens, positions, meta, streamed.kv, schedule))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    return backend, step, want


def test_streamed_decode_under_cuda_graphs(platform):
    """Capture a decode step with streamed layers twice back to back, replay, then run eagerly again."""
    backend, step, want = captured_decode_step(platform, [1, 2, 4, 5])
    graphs, outputs = [], []
    for _ in range(2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs.append(step())
        graphs.append(graph)
    for graph, out in zip(graphs, outputs):
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert not out.isnan().any(), "a captured layer read its slot before the captured copy"
            assert relative_error(out, want) < 1e-5
    assert relative_error(step(), want) < 1e-5, "eager calls after capture still order correctly"
    backend.close()


def test_eager_steps_interleaved_with_replays_without_synchronising(platform):
    """replay -> eager -> replay -> eager ... with no host sync: an eager copy must not overwrite a slot
    that a replay launched before it still reads (poisoned slots turn such a race into NaN)."""
    backend, step, want = captured_decode_step(platform, [0, 1, 2, 3, 4, 5])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    results = []
    for _ in range(20):
        backend.replay(graph)
        results.append(captured.clone())   # ordered after the replay on the same stream
        results.append(step())             # eager copies right behind the replay, no sync in between
    torch.cuda.synchronize()
    assert not any(r.isnan().any() for r in results), "a copy overwrote a slot a replay was still reading"
    assert max(relative_error(r, want) for r in results) < 1e-5
    backend.close()


def test_factory_backend_measures_copy_waits(platform):
    slab = allocate(64 << 20, node=None, policy="default")
    prepare_slab_for_device(slab, platform)
    backend = make_transfer_backend("cuda", 64 << 20, 1, poison=False)
    for _ in range(4):
        backend.copy(0, slab.tensor)
        backend.wait_copy(0)
        backend.slots[0][:16].sum()
        backend.compute_done(0)
    torch.cuda.synchronize()
    assert backend.wait_seconds > 0.0, "a 64 MiB copy waited for right after issue must show up as wait time"
    backend.close()
