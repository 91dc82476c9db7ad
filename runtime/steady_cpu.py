"""glibc's malloc thresholds, set per process: steadier timings for a CPU executor, bounded
memory with few page faults for a server.

glibc serves an allocation above its mmap threshold from a fresh ``mmap`` and unmaps it at
``free``, and it returns the top of its heap to the system once more than the trim threshold is
free there. Both by default adjust themselves upwards (to each large block freed, up to 32 MB).
Setting them fixes them. Process wide, hence a script-level choice, not the library's; a no-op
where glibc is absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 1 << 30
"""the torch executor's thresholds: everything stays in the heap"""


@functools.cache
def _c_library() -> ctypes.CDLL | None:
    """The C library this process runs on, looked up once: ``find_library`` runs ``ldconfig``
    in a child process each time, which the trimmer's every call did at first."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _glibc(function: str):
    """``function`` of the C library where it is glibc's (it has ``mallopt``), else None."""
    library = _c_library()
    if library is None:
        return None
    try:
        library.mallopt  # noqa: B018 (glibc's, not another C library's)
        return getattr(library, function)
    except AttributeError:
        return None


def set_malloc_thresholds(mmap_bytes: int, trim_bytes: int) -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where the C library is not
    glibc or refused them."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_bytes)) and bool(
        mallopt(M_TRIM_THRESHOLD, trim_bytes))


def trim_heap() -> bool:
    """Give the free pages of glibc's heaps back to the system (``malloc_trim(0)``): those in
    the holes between blocks in use as well as the top. False where there is no glibc or it had
    nothing to give back."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim.argtypes = (ctypes.c_size_t,)
    return bool(trim(0))


def steady_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds to 1 GiB; True when it took effect. Every
    iteration of the torch executor otherwise page-faults its large activation buffers in again
    (measured: a tiny-shape mixed iteration at 9.7 ms with the defaults, 7.2 ms with the
    thresholds raised)."""
    return set_malloc_thresholds(THRESHOLD_BYTES, THRESHOLD_BYTES)
