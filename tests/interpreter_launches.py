"""Triton's interpreter, launched faster: it lists ``triton.language``'s builtins for every launch.

Before each interpreted launch, Triton 3.x's interpreter (``triton/runtime/interpreter.py: _patch_lang``) swaps
every builtin of ``triton.language``, its tensor class and ``math`` for an interpreted one, and puts them back after.
It finds them with ``inspect.getmembers`` each time: ~0.3 ms a module on this CI's CPUs, five modules a launch, some
thousands of launches in a kernel test (the fused decode layer's tests spent two thirds of their time there). The
modules are restored after every launch, so the list is the same every time: it is made once per module here. The
kernels run in the same interpreter, launch for launch.
"""
from __future__ import annotations

import inspect


def list_builtins_once() -> bool:
    """Make the interpreter list each module's builtins once (False: this Triton has no such step to speed up)."""
    try:
        from triton import language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if patch_attr is None or not hasattr(interpreter, "_patch_builtin") or not hasattr(tl.core, "is_builtin"):
        return False
    listed: dict[int, tuple[object, list]] = {}

    def patch_builtin(pkg, builder, scope) -> None:
        entry = listed.get(id(pkg))
        if entry is None or entry[0] is not pkg:
            entry = listed[id(pkg)] = (pkg, [(name, member) for name, member in inspect.getmembers(pkg)
                                              if tl.core.is_builtin(member)])
        for name, member in entry[1]:
            # what the interpreter does: patch the members that are builtins now (a device function's call
            # patches again inside its kernel's launch, where they are interpreted ones already)
            if getattr(pkg, name, None) is member:
                patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin
    return True
