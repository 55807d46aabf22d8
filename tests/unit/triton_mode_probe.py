"""Run by test_triton_mode.py in its own pytest session: prints how the session's Triton kernels run."""
from gh200rt.kernels.triton.host_read import sum_words_kernel


def test_print_kernel_type():
    print(f"kernel type: {type(sum_words_kernel).__name__}")
