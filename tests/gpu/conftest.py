import os

import pytest


@pytest.fixture
def compiled_triton():
    """Tests that judge the compiled Triton kernels: tests/conftest.py interprets them only without a CUDA device,
    or when TRITON_INTERPRET is set explicitly."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set, so Triton would interpret the kernels instead of compiling them; "
                    "run with TRITON_INTERPRET=0 (scripts/validate_gpu.py does)")


@pytest.fixture
def platform():
    from gh200rt.platform.detect import detect
    return detect()
