"""Registered host slabs behave as pinned memory for torch's pinned check, torch's capture-time copy check
and Triton's pointer check (issue 10, item 10): the same checks scripts/validate_gpu.py runs first."""
import pytest

from gh200rt.backends.cuda.registration_check import check_registered_slab, failure_message


def assert_all_pass(platform):
    checks = check_registered_slab(platform)
    assert [c.name for c in checks] == ["is_pinned", "triton_pointer", "graph_capture"], checks
    message = failure_message(checks, platform.kind)
    assert message is None, message


@pytest.mark.gh200
def test_gh200_registered_slabs_pass_the_three_pinned_checks(compiled_triton, platform):
    assert platform.kind == "gh200" and platform.ats
    assert_all_pass(platform)


@pytest.mark.gpu
def test_registered_slabs_pass_the_three_pinned_checks(compiled_triton, platform):
    assert_all_pass(platform)
