import pytest
import torch

from gh200rt.kernels.triton.host_read import reference_sum_words, sum_words


@pytest.mark.parametrize("n_words", [1, 1000, 1024 * 8 + 3, 40_000])
def test_sum_words_matches_reference(n_words):
    g = torch.Generator().manual_seed(n_words)
    words = torch.randint(-2**40, 2**40, (n_words,), dtype=torch.int64, generator=g)
    got, want = sum_words(words, n_words, device="cpu", block=256, iters=4), reference_sum_words(words)
    print(f"n_words={n_words}: kernel {got} reference {want} difference {got - want}")
    assert got == want


@pytest.mark.gpu
def test_sum_host_buffer_in_place():
    from gh200rt.kernels.triton.host_read import sum_host_bytes
    from gh200rt.numa.alloc import allocate
    buf = allocate(8 << 20, node=0)
    buf.tensor.view(torch.int64)[:] = torch.arange((8 << 20) // 8)
    buf.register_cuda(mapped=True)
    try:
        assert sum_host_bytes(buf) == reference_sum_words(buf.tensor.view(torch.int64))
    finally:
        buf.free()
