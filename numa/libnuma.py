"""libnuma through ctypes: memory policy (mbind) and page placement queries (move_pages).

The library, not raw syscall numbers: those differ between x86_64 and aarch64 (Grace).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE = 0, 1, 2, 3
MPOL_MF_STRICT, MPOL_MF_MOVE = 1, 2
POLICY_MODES = {"default": MPOL_DEFAULT, "preferred": MPOL_PREFERRED, "bind": MPOL_BIND,
                "interleave": MPOL_INTERLEAVE}

INSTALL_HINT = ("install libnuma: `apt-get install libnuma1` (Debian/Ubuntu), `dnf install numactl-libs` "
                "(RHEL/Fedora), `zypper install libnuma1` (SUSE)")


class LibnumaMissing(RuntimeError):
    pass


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL:
    """The loaded libnuma, checked usable; ``LibnumaMissing`` names the package otherwise."""
    name = ctypes.util.find_library("numa") or "libnuma.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise LibnumaMissing(f"libnuma is not installed ({e}); {INSTALL_HINT}") from None
    lib.numa_available.restype = ctypes.c_int
    if lib.numa_available() < 0:
        raise LibnumaMissing("libnuma reports that this kernel has no NUMA support (numa_available() < 0)")
    lib.numa_max_node.restype = ctypes.c_int
    lib.mbind.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.POINTER(ctypes.c_ulong),
                          ctypes.c_ulong, ctypes.c_uint]
    lib.mbind.restype = ctypes.c_long
    lib.move_pages.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.POINTER(ctypes.c_void_p),
                               ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.move_pages.restype = ctypes.c_long
    return lib


def _nodemask(nodes: list[int]) -> tuple[ctypes.Array, int]:
    words = max(nodes) // 64 + 1
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    return mask, words * 64 + 1


def mbind(address: int, nbytes: int, policy: str, nodes: list[int]) -> None:
    lib = load()
    mode = POLICY_MODES[policy]
    if mode == MPOL_DEFAULT:
        rc = lib.mbind(address, nbytes, mode, None, 0, 0)
    else:
        mask, maxnode = _nodemask(nodes)
        rc = lib.mbind(address, nbytes, mode, mask, maxnode, MPOL_MF_STRICT | MPOL_MF_MOVE)
    if rc != 0:
        err = ctypes.get_errno()
        import os
        raise OSError(err, f"mbind({policy}, nodes={nodes}) failed: {os.strerror(err)}")


def page_nodes(address: int, nbytes: int, page_size: int) -> list[int]:
    """The node of every page in [address, address + nbytes) (negative errno for pages not present)."""
    lib = load()
    count = (nbytes + page_size - 1) // page_size
    pages = (ctypes.c_void_p * count)(*(address + i * page_size for i in range(count)))
    status = (ctypes.c_int * count)()
    rc = lib.move_pages(0, count, pages, None, status, 0)
    if rc != 0:
        err = ctypes.get_errno()
        import os
        raise OSError(err, f"move_pages query failed: {os.strerror(err)}")
    return list(status)
