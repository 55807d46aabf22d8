import os

from tests import triton_mode  # pytest's pythonpath puts the repository root on sys.path first

# Before any @triton.jit function is defined: the interpreter only where no CUDA device exists, so
# `pytest -m gpu` on a GPU host runs the compiled kernels (an explicit TRITON_INTERPRET wins).
triton_mode.apply(os.environ)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def _is_gh200() -> bool:
    if not _has_cuda():
        return False
    from gh200rt.platform.detect import detect
    return detect().kind == "gh200"


def pytest_collection_modifyitems(config, items):
    has_cuda = _has_cuda()
    is_gh200 = has_cuda and _is_gh200()
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    for item in items:
        if "interpreter" in item.keywords and not interpreting:
            item.add_marker(pytest.mark.skip(reason="launches Triton kernels on CPU tensors, which needs "
                                                    "TRITON_INTERPRET=1; on a CUDA host the gpu tests judge the "
                                                    "compiled kernels against the same references"))
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "gh200" in item.keywords and not is_gh200:
            item.add_marker(pytest.mark.skip(reason="needs a GH200"))
