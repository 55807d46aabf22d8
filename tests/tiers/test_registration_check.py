"""The registration check's CPU-side contract: it refuses the cpu platform and reports every failed check."""
import pytest

from gh200rt.backends.cuda.registration_check import Check, check_registered_slab, failure_message
from gh200rt.platform.detect import detect


def test_refuses_the_cpu_platform():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        check_registered_slab(detect("cpu"))


def test_failure_message_names_every_failed_check():
    checks = [Check("is_pinned", False, "tensor.is_pinned() is False"), Check("triton_pointer", True, "fine"),
              Check("graph_capture", False, "capture refused")]
    message = failure_message(checks, "gh200")
    assert "gh200" in message and "is_pinned: tensor.is_pinned() is False" in message
    assert "graph_capture: capture refused" in message and "triton_pointer" not in message
    assert failure_message(checks[1:2], "gh200") is None
