"""The native CPU library built for another x86 ISA level than this host's (``-march=`` in place of native), in a
cache directory of its own: the tests that hold one build's results to another's."""
from __future__ import annotations

import pytest

from gh200rt.backends.cpu import native
from gh200rt.backends.cpu.native_ops import NativeOps


def native_ops_for(march: str, cache_dir) -> NativeOps:
    """The ops compiled with ``-march=<march>`` into ``cache_dir``; loading them leaves this process's own build
    (``load_native_ops()``) as it was."""
    patch = pytest.MonkeyPatch()
    patch.setenv("GH200RT_CACHE_DIR", str(cache_dir))
    patch.setattr(native, "FLAGS", tuple(f"-march={march}" if flag == "-march=native" else flag
                                             for flag in native.FLAGS))
    try:
        return native._load()
    finally:
        patch.undo()
