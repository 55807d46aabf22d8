import torch

from gh200rt.weights.slabs import allocate_slab
from gh200rt.transfer.cpu_backend import CpuTransferBackend


def test_ring_copies_layers_in_order_and_counts():
    layers = [torch.randn(1000) for _ in range(5)]
    slabs = [allocate_slab(t.nbytes) for t in layers]
    for slab, t in zip(slabs, layers):
        slab.tensor.copy_(t.view(torch.uint8))
    slots = [torch.empty(1000) for _ in range(2)]
    backend = CpuTransferBackend(slots, poison=True)
    backend.copy(0, slabs[0].tensor)
    for pos in range(5):
        slot = pos % 2
        if pos + 1 < 5:
            backend.copy((pos + 1) % 2, slabs[pos + 1].tensor)
        backend.wait_copy(slot)
        assert torch.equal(slots[slot], layers[pos])
        backend.compute_done(slot)
    backend.close()
    assert backend.bytes_copied == 5 * 4000 and backend.wait_seconds >= 0


def test_poison_is_visible_before_copy_lands():
    slot = torch.zeros(4)
    backend = CpuTransferBackend([slot], poison=True)
    backend._worker.submit(lambda: __import__("time").sleep(0.2))  # hold the worker
    backend.copy(0, torch.ones(4).view(torch.uint8))
    assert torch.isnan(slot).all()  # a read-before-copy sees NaN
    backend.wait_copy(0)
    assert torch.equal(slot, torch.ones(4))
    backend.close()
