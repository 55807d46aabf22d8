"""make_transfer_backend: the CPU backend it builds streams a ring correctly; bad requests fail clearly."""
import pytest
import torch

from gh200rt.weights.slabs import allocate_slab
from gh200rt.transfer.backend import make_transfer_backend
from gh200rt.transfer.cpu_backend import CpuTransferBackend


def test_cpu_backend_has_uint8_slots_of_the_asked_size():
    backend = make_transfer_backend("cpu", 4096, 3, poison=False)
    assert isinstance(backend, CpuTransferBackend)
    assert [(s.dtype, s.numel(), s.device.type) for s in backend.slots] == [(torch.uint8, 4096, "cpu")] * 3
    assert len({s.data_ptr() for s in backend.slots}) == 3
    backend.close()


def test_cpu_backend_streams_layers_through_a_poisoned_ring():
    layers = [torch.randn(250) for _ in range(5)]
    slabs = [allocate_slab(t.nbytes) for t in layers]
    for slab, t in zip(slabs, layers):
        slab.tensor.copy_(t.view(torch.uint8))
    backend = make_transfer_backend(torch.device("cpu"), 1000, 2, poison=True)
    addresses = [s.data_ptr() for s in backend.slots]
    backend.copy(0, slabs[0].tensor)
    for pos in range(5):
        if pos + 1 < 5:
            backend.copy((pos + 1) % 2, slabs[pos + 1].tensor)
        backend.wait_copy(pos % 2)
        assert torch.equal(backend.slots[pos % 2].view(torch.float32), layers[pos])
        backend.compute_done(pos % 2)
    backend.close()
    assert backend.bytes_copied == 5 * 1000
    assert [s.data_ptr() for s in backend.slots] == addresses, "slots never move"


@pytest.mark.parametrize("slot_bytes,num_slots,match", [(0, 2, "positive byte size"), (64, 0, "at least one slot"),
                                                        (64.5, 2, "positive byte size")])
def test_bad_sizes_are_user_errors(slot_bytes, num_slots, match):
    with pytest.raises(ValueError, match=match):
        make_transfer_backend("cpu", slot_bytes, num_slots, poison=False)


def test_unknown_device_is_a_user_error():
    with pytest.raises(ValueError, match="cpu or cuda"):
        make_transfer_backend("meta", 64, 2, poison=False)


def test_cuda_backend_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: tests/gpu covers the CUDA backend")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        make_transfer_backend("cuda", 64, 2, poison=False)


def test_cuda_backend_module_imports_without_cuda():
    from gh200rt.transfer import cuda_backend
    assert hasattr(cuda_backend, "CudaTransferBackend")
