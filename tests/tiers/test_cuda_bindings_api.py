"""The cuda.bindings runtime calls the CUDA paths make exist under these names and return their error
codes as tuples (so a CPU machine checks the call shapes; the calls themselves run on the GPU hosts)."""
import pytest
import torch

rt = pytest.importorskip("cuda.bindings.runtime")


def test_names_used_for_registration_ats_and_capture_exist():
    assert rt.cudaHostRegisterPortable and rt.cudaHostRegisterMapped
    assert rt.cudaDeviceAttr.cudaDevAttrPageableMemoryAccessUsesHostPageTables is not None
    assert rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive is not None
    for name in ("cudaHostRegister", "cudaHostUnregister", "cudaHostGetDevicePointer", "cudaStreamGetCaptureInfo"):
        assert callable(getattr(rt, name)), name


def test_capture_info_returns_error_status_and_id_first():
    if torch.cuda.is_available():
        pytest.skip("with a GPU the call succeeds; tests/gpu captures graphs for real")
    err, status, capture_id, *_ = rt.cudaStreamGetCaptureInfo(0)
    assert err != rt.cudaError_t.cudaSuccess and status is None and capture_id is None


def test_registering_a_slab_without_a_driver_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("with a GPU registration succeeds; tests/gpu covers it")
    from gh200rt.weights.device_view import prepare_slab_for_device
    from gh200rt.numa.alloc import allocate
    from gh200rt.platform.detect import Platform
    from gh200rt.platform.profiles import get_profile
    slab = allocate(1 << 16, node=None, policy="default")
    with pytest.raises(RuntimeError, match="cudaHostRegister of 65536 bytes at 0x[0-9a-f]+ failed"):
        prepare_slab_for_device(slab, Platform.from_profile(get_profile("h100-pcie")))
    slab.free()
