"""Does a registered host slab behave as pinned memory for the three consumers that rely on it?

Where ``pageableMemoryAccessUsesHostPageTables`` is 1 (GH200, ATS), ``cudaHostRegister`` populates the
pages but need not page-lock them (issue 10, item 10). gh200rt assumes that three consumers accept a slab
registered by ``prepare_slab_for_device`` all the same:

1. ``tensor.is_pinned()`` — torch asks the CUDA runtime what the pointer is; the transfer backend refuses
   a source that is not pinned;
2. a ``non_blocking`` host-to-device copy from it captured in a CUDA graph — torch refuses to capture a
   copy from host memory it does not see as pinned (and STREAMED layers are copied inside graphs);
3. a Triton kernel reading the slab in place — Triton's launcher asks the driver for each pointer
   argument's device address and refuses host memory the driver does not know (the DIRECT tier).

``check_registered_slab(platform)`` allocates a slab through gh200rt.numa, registers it as the placement
does, runs the three checks (each independent of the others' outcome), then unregisters and frees it.
scripts/validate_gpu.py runs it first on a GPU host and stops if any check fails;
tests/gpu/test_gpu_registration.py asserts it.
"""
from __future__ import annotations

from dataclasses import dataclass

SLAB_BYTES = 8 << 20


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def host_page_tables_attribute(device: int = 0) -> int | None:
    """``cudaDevAttrPageableMemoryAccessUsesHostPageTables`` of ``device`` (1 on GH200), None if unreadable."""
    try:
        from cuda.bindings import runtime as rt
        err, value = rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrPageableMemoryAccessUsesHostPageTables,
                                               device)
    except Exception:  # no cuda-bindings, or no driver: the caller reports "unknown"
        return None
    return int(value) if err == rt.cudaError_t.cudaSuccess else None


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    if exc.__context__ is not None:  # torch's graph context may raise again while ending a failed capture
        text += f" (while handling {type(exc.__context__).__name__}: {exc.__context__})"
    return text[:600]


def _is_pinned(slab) -> Check:
    pinned = bool(slab.tensor.is_pinned())
    return Check("is_pinned", pinned, "tensor.is_pinned() is True" if pinned else
                 "tensor.is_pinned() is False: torch does not see the registered slab as pinned memory")


def _triton_reads_in_place(slab, platform) -> Check:
    import torch

    from gh200rt.kernels.triton.host_read import sum_words
    from gh200rt.weights.device_view import device_view
    n_words = slab.nbytes // 8
    try:
        words = device_view(slab, platform, "cuda")[: n_words * 8].view(torch.int64)
        got = sum_words(words, n_words)
    except Exception as exc:
        return Check("triton_pointer", False, f"a Triton kernel could not read the slab in place: {_error(exc)}")
    want = int(slab.tensor[: n_words * 8].view(torch.int64).sum())
    same = (got - want) % (1 << 64) == 0  # both sums wrap modulo 2**64
    return Check("triton_pointer", same, "a Triton kernel read the slab in place and summed it correctly" if same
                 else f"a Triton kernel read the slab in place but summed {got}, the host sums {want}")


def _graph_captures_copy(slab) -> Check:
    import torch
    src = slab.tensor
    dst = torch.empty(slab.nbytes, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch's graph documentation asks
        dst.copy_(src, non_blocking=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            dst.copy_(src, non_blocking=True)
    except Exception as exc:
        return Check("graph_capture", False, f"capturing a non_blocking H2D copy from the slab failed: {_error(exc)}")
    try:
        dst.fill_(0)
        src[:4096] = 7  # the replay must copy the host bytes as they are now, not as they were at capture
        graph.replay()
        torch.cuda.synchronize()
        same = torch.equal(dst.cpu(), src)
    except Exception as exc:
        return Check("graph_capture", False, f"replaying the captured copy failed: {_error(exc)}")
    finally:
        del graph
    return Check("graph_capture", same, "a captured non_blocking copy replayed the slab's current bytes" if same
                 else "the replayed copy did not deliver the slab's current bytes")


def check_registered_slab(platform=None, nbytes: int = SLAB_BYTES) -> list[Check]:
    """Register a ``nbytes`` gh200rt.numa slab as the placement does and run the three checks."""
    import torch

    from gh200rt.numa.alloc import allocate
    from gh200rt.platform.detect import detect
    from gh200rt.weights.device_view import prepare_slab_for_device
    platform = platform or detect()
    if platform.kind == "cpu" or not torch.cuda.is_available():
        raise ValueError("check_registered_slab needs a CUDA device: on the cpu platform nothing is registered")
    slab = allocate(nbytes, node=None, policy="default")
    try:
        slab.tensor.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8,
                                        generator=torch.Generator().manual_seed(0)))
        try:
            prepare_slab_for_device(slab, platform)
        except Exception as exc:
            return [Check("register", False, f"prepare_slab_for_device (cudaHostRegister) failed: {_error(exc)}")]
        return [_is_pinned(slab), _triton_reads_in_place(slab, platform), _graph_captures_copy(slab)]
    finally:
        try:
            torch.cuda.synchronize()
        finally:  # unregister before unmapping, even when a failed check left the device in an error state
            slab.free()


def failure_message(checks: list[Check], platform_kind: str) -> str | None:
    """One message naming every failed check, or None when all passed."""
    failed = [c for c in checks if not c.ok]
    if not failed:
        return None
    lines = [f"registered host slabs do not behave as pinned memory on this {platform_kind} host; "
             "STREAMED and DIRECT placements would fail or be wrong here:"]
    lines += [f"  - {c.name}: {c.detail}" for c in failed]
    return "\n".join(lines)
