"""Transfer scheduler backends: fill fixed staging slots from host slabs ahead of use.

``backend.make_transfer_backend(device, slot_bytes, num_slots, poison)`` returns the CPU backend
(copy thread, cpu_backend.py) or the CUDA backend (copy stream and events, cuda_backend.py); both
follow ``backend.TransferBackend``. Nothing CUDA-only is imported until a CUDA backend is made.
"""
