"""Large blocks go back to the system when they are freed; the blocks of ordinary requests stay.

glibc's malloc serves a block over its mmap threshold from a fresh mapping and unmaps it on
free, but it raises that threshold to the size of each such block freed (up to 32 MB), after
which large blocks come from its arenas, one per thread that allocates, and stay there. A server
that reads 16 MB policy files on the thread pool (a reload) grew 530 MB in 20 s of repeated
reloads that way, where one thread grew none. Fixing the threshold keeps every block over it
mapped and unmapped: the server's memory then follows what it holds.

The threshold is 4 MB, not glibc's starting 128 KB: at 128 KB every copy of a 256-row batch
body (about 260 KB, copied several times between the socket, the server and its batch worker)
was a fresh mapping faulted in page by page, and the kernel's share of the batch route's CPU was
half of it (measured: 1.3 ms of system time a request in the server and 1.0 ms in the worker,
0.3 and 0.5 ms at 1 MB). At 1 MB, orjson's working buffer for such a body (between 2 and 4 MB)
was still a fresh mapping: 124 page faults a parse, none at 4 MB. A body at the default size
cap (4 MB) and a policy file of that size or more are still mapped on their own. The trim
threshold is fixed with it, so that a freed block at the top of the heap is kept for the next
request rather than given back and faulted in again.
"""

from __future__ import annotations

from runtime.steady_cpu import set_malloc_thresholds

MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
"""blocks at least this large are mapped on their own: a policy file of 4 MB or more, a body at
the default size cap (4 MB)"""
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
"""free memory at the top of a heap kept for reuse, at most"""


def return_large_blocks(threshold: int = MMAP_THRESHOLD_BYTES,
                        trim: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes and its trim threshold at ``trim`` for
    this process; False where the C library is not glibc (nothing to do)."""
    return set_malloc_thresholds(threshold, trim)
