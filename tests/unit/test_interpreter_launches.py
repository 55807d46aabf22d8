"""The interpreter's builtins listed once (tests/interpreter_launches.py) leave kernels' results and the language
as they were: a launch, a launch whose kernel calls device functions, and triton.language restored after both."""
import inspect

import pytest
import torch

pytestmark = pytest.mark.interpreter


def test_launches_give_the_reference_and_restore_the_language():
    triton = pytest.importorskip("triton")
    from triton import language as tl
    from triton.runtime import interpreter

    from gh200rt.kernels.triton import gemv as gemv_module
    if not hasattr(interpreter, "_patch_builtin"):
        pytest.skip("this Triton's interpreter lists no builtins per launch")
    assert interpreter._patch_builtin.__module__ == "tests.interpreter_launches", "conftest did not install it"
    before = {name: member for name, member in inspect.getmembers(tl) if tl.core.is_builtin(member)}
    x, w = torch.randn(1, 64), torch.randn(96, 64)
    for _ in range(2):                     # the second launch patches from the list made by the first
        got = gemv_module.gemv(x, w)
        torch.testing.assert_close(got, x @ w.T, rtol=1e-5, atol=1e-5)
    after = {name: member for name, member in inspect.getmembers(tl) if tl.core.is_builtin(member)}
    assert after == before and before, "a launch left triton.language patched"
    assert triton.language is tl
