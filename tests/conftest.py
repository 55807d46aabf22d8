import os

# Must be set before any @triton.jit function is defined (kernels are checked in the interpreter here).
os.environ.setdefault("TRITON_INTERPRET", "1")
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
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "gh200" in item.keywords and not is_gh200:
            item.add_marker(pytest.mark.skip(reason="needs a GH200"))
