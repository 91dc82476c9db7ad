"""Large blocks go back to the system when they are freed.

glibc's malloc serves a block over its mmap threshold from a fresh mapping and unmaps it on
free, but it raises that threshold to the size of each such block freed (up to 32 MB), after
which large blocks come from its arenas, one per thread that allocates, and stay there. A server
that reads 16 MB policy files on the thread pool (a reload) grew 530 MB in 20 s of repeated
reloads that way, where one thread grew none. Fixing the threshold keeps every block over it
mapped and unmapped: the server's memory then follows what it holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util

MMAP_THRESHOLD_BYTES = 128 * 1024
"""blocks at least this large are mapped on their own (glibc's starting threshold)"""
_M_MMAP_THRESHOLD = -3


def return_large_blocks(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; False where the C
    library is not glibc (nothing to do)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
