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

What the thresholds leave are holes: freed blocks between blocks still in use, which glibc
keeps. Under clients posting 3-4 MB bodies the batch worker's large lane grew from 64 to 123 MB
and stayed there, the server from 100 to 121 MB, all of it free memory no request held. A
:class:`HeapTrimmer` gives those pages back (``malloc_trim``) once the process has grown by
:data:`TRIM_GROWTH_BYTES` since the last time, at most every :data:`TRIM_INTERVAL_S`.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable

from runtime.steady_cpu import set_malloc_thresholds, trim_heap

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


TRIM_GROWTH_BYTES = 4 * 1024 * 1024
"""a process that has grown this much since its last trim gives its free pages back"""
TRIM_INTERVAL_S = 1.0
"""seconds between two trims at least (one costs about 0.2 ms a MB it gives back, and 0.2-0.7 ms
when there is nothing to give back, measured)"""


def freeze_start_up_objects() -> int:
    """Move every object alive now out of the cyclic garbage collector's reach (``gc.freeze``)
    and return how many. Called once a serving process has imported and built what it serves
    (the app, the decider, FastAPI's and pydantic's schemas: about 70,000 objects in the
    server): a full collection walked them all, 28-42 ms with the event loop stopped, a few times
    a minute under load (measured in a soak); with them frozen the longest was 1.6 ms. They live
    as long as the process, so nothing is lost by never collecting them."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def resident_bytes() -> int | None:
    """This process's resident size from ``/proc/self/statm``; None where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class HeapTrimmer:
    """Returns the heap's free pages to the system when the process has grown.

    :param growth_bytes: growth in resident size since the last trim (or since this was made)
        that makes a trim due
    :param interval_s: seconds between two trims at least
    :param resident: the process's resident size (None where it cannot be read: never due)
    :param trim: what trims (:func:`runtime.steady_cpu.trim_heap`)
    :param clock: seconds
    """

    def __init__(self, growth_bytes: int = TRIM_GROWTH_BYTES,
                 interval_s: float = TRIM_INTERVAL_S,
                 resident: Callable[[], int | None] = resident_bytes,
                 trim: Callable[[], bool] = trim_heap,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.growth_bytes = growth_bytes
        self.interval_s = interval_s
        self._resident = resident
        self._trim = trim
        self._clock = clock
        self.level = resident()
        """the resident size after the last trim"""
        self.next_at = clock()
        """when a trim may next run"""
        self.trims = 0
        """trims run"""

    def grown(self) -> bool:
        """Whether the process has grown by ``growth_bytes`` since the last trim."""
        now = self._resident()
        if now is None or self.level is None:
            return False
        if now < self.level:  # it shrank on its own: measure growth from there
            self.level = now
        return now - self.level >= self.growth_bytes

    def wait_s(self) -> float:
        """Seconds until a trim may run (0 when it may now)."""
        return max(0.0, self.next_at - self._clock())

    def trim(self) -> None:
        """Trim now, and start measuring growth from the size that leaves."""
        self._trim()
        self.trims += 1
        self.level = self._resident()
        self.next_at = self._clock() + self.interval_s

    def maybe_trim(self) -> bool:
        """Trim if the process has grown and the interval has passed; whether it did."""
        if self.wait_s() > 0 or not self.grown():
            return False
        self.trim()
        return True

    def start(self) -> threading.Thread:
        """Check every ``interval_s`` on a daemon thread of its own (the server: ``malloc_trim``
        runs without the GIL, beside the event loop)."""
        def run() -> None:
            while True:
                time.sleep(self.interval_s)
                self.maybe_trim()

        thread = threading.Thread(target=run, name="heap-trimmer", daemon=True)
        thread.start()
        return thread
