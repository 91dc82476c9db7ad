"""The paged KV block pool: ids ``0 .. num_blocks-1``, allocation of the lowest free ids first.

Lowest-first keeps the tail of the pool free, so that shrinking it (a lower ``kv_cache_ratio``)
rarely has blocks to move. Freed blocks are reused last-in first-out, which keeps allocation and
release O(blocks moved) with plain list slices: the engine allocates about one block every 16
tokens of every request, so this is on the hot path. (A numpy stack made the per-interval
fragmentation score 3.6x cheaper but whole-trace replays 35% slower and environment steps no
faster: measured side by side on the Azure conversation trace.)

The fragmentation score, read once per decision interval, needs the free ids as an array; turning
the whole Python list into one cost 60-80 us at a 3,000-block pool, more than the rest of closing
an interval. The pool instead keeps the array it built last time and a low-water mark: the
length the free list's unchanged prefix had since then (only ``allocate`` lowers it; ``free``
appends above it; ``grow`` and ``shrink`` rewrite the list and the array with it), so only the
ids pushed since are converted; and while nothing moved (an idle interval) the last score holds.
"""

from __future__ import annotations

import struct

import numpy as np


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least 1 block, got {num_blocks}")
        self.num_blocks = num_blocks
        # A stack: the next block handed out is the last element.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._array = np.zeros(0, dtype=np.int32)
        """the free list as an array when fragmentation() last read it"""
        self._stable = 0
        """the free list's first ``_stable`` entries are still those of ``_array``"""
        self._score: float | None = None
        """fragmentation() of ``_array`` (None until read): an idle interval reads it again"""

    def copy(self) -> BlockPool:
        """An independent pool with the same free list (in the same order)."""
        c = BlockPool.__new__(BlockPool)
        c.num_blocks = self.num_blocks
        c._free = self._free[:]
        c._array = self._array  # never written in place: shared until either pool rebuilds it
        c._stable = self._stable
        c._score = self._score
        return c

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def utilization(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def allocate(self, n: int) -> list[int] | None:
        """Hand out ``n`` blocks, or None (and nothing) when fewer than ``n`` are free."""
        free = self._free
        if n > len(free):
            return None
        if n <= 0:
            return []
        ids = free[-n:]
        del free[-n:]
        if len(free) < self._stable:
            self._stable = len(free)
        return ids

    def allocate_one(self) -> int | None:
        """One block, or None when none is free (the decode path: one token at a time)."""
        free = self._free
        if not free:
            return None
        if len(free) <= self._stable:
            self._stable = len(free) - 1
        return free.pop()

    def free(self, ids: list[int]) -> None:
        self._free.extend(ids)

    def free_ids(self) -> list[int]:
        return list(self._free)

    def grow(self, num_blocks: int) -> None:
        """Add ids ``self.num_blocks .. num_blocks-1``; they are handed out after the old ones."""
        if num_blocks < self.num_blocks:
            raise ValueError(f"grow() to {num_blocks} blocks from {self.num_blocks}: use shrink()")
        k = self._stable
        self._free[:0] = range(num_blocks - 1, self.num_blocks - 1, -1)
        # the kept array stays the free list's prefix: the new ids, then the old prefix (a read
        # after a resize converts only what moved since, not the whole pool)
        self._array = np.concatenate((np.arange(num_blocks - 1, self.num_blocks - 1, -1,
                                                dtype=np.int32), self._array[:k]))
        self._stable = num_blocks - self.num_blocks + k
        self._score = None
        self.num_blocks = num_blocks

    def shrink(self, num_blocks: int) -> dict[int, int]:
        """Cut the pool to ids ``0 .. num_blocks-1``; returns ``{old_id: new_id}`` for every used
        block that had to move below the cut (the caller rewrites its block tables).

        The caller must first release enough blocks: refuses when more than ``num_blocks`` are
        in use.
        """
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least 1 block, got {num_blocks}")
        if num_blocks > self.num_blocks:
            raise ValueError(f"shrink() to {num_blocks} blocks from {self.num_blocks}: use grow()")
        if self.num_used > num_blocks:
            raise ValueError(f"cannot shrink to {num_blocks} blocks with {self.num_used} in use")
        # In numpy over the sorted free ids: the environment's policy moves the KV ratio nearly
        # every step, and sets and sorts of Python ints over a 3,000-block pool cost more than
        # the engine's own step. The used blocks above the cut move, in id order, to the lowest
        # free ids below it; the rest of those stay free, lowest first out.
        ids = self._sorted_free()
        cut = int(np.searchsorted(ids, num_blocks))
        used = np.ones(self.num_blocks - num_blocks, dtype=bool)
        used[ids[cut:] - num_blocks] = False
        used_above = (np.flatnonzero(used) + num_blocks).tolist()
        moved = len(used_above)
        remap = dict(zip(used_above, ids[:moved].tolist()))
        remaining = ids[moved:cut][::-1].copy()
        self._free = remaining.tolist()
        self._array = remaining
        self._stable = len(remaining)
        self._score = None
        self.num_blocks = num_blocks
        return remap

    def _sorted_free(self) -> np.ndarray:
        """The free ids, sorted (converting only the ids pushed since the last call)."""
        free = self._free
        n = len(free)
        k = self._stable
        if k == n == len(self._array):
            unsorted = self._array
        else:
            unsorted = np.empty(n, dtype=np.int32)
            unsorted[:k] = self._array[:k]
            # packed by struct, not assigned from the list: numpy's conversion of a list looks
            # at every element's type first (about 300 instructions an id against 130; an
            # interval of azure-conv x2 pushes about 120 ids)
            unsorted[k:] = np.frombuffer(struct.pack(f"{n - k}i", *free[k:]), dtype=np.int32)
            self._array = unsorted
            self._stable = n
            self._score = None
        return np.sort(unsorted)

    def free_gaps(self) -> np.ndarray:
        """Sizes of the maximal runs of contiguous free block ids."""
        if not self._free:
            return np.zeros(0, dtype=np.int64)
        return _runs(self._sorted_free())

    def fragmentation(self) -> float:
        """0 when the free blocks form one contiguous run, towards 1 as they scatter.

        ``1 - sum(gap^2) / free^2``. DESIGN.md's raw ``sum(gap^2) / pool^2`` also falls as the
        pool fills, which mixes utilisation into it; normalising by the free count keeps the
        two signals apart (utilisation is its own observation field). An empty free list is 0.
        """
        free = self._free
        n = len(free)
        if n == 0:
            return 0.0
        if self._stable == n == len(self._array) and self._score is not None:
            return self._score  # no block taken or freed since the last read
        if n < _FEW_FREE:
            return _score_of_few(sorted(free))
        ids = self._sorted_free()
        # Each run but the last ends at a break; the runs are (breaks[0] + 1, the breaks'
        # differences, n - 1 - breaks[-1]). Read that way rather than through _runs: read every
        # interval, and half as many numpy calls on a free list of a few hundred ids.
        breaks = (ids[1:] - ids[:-1] != 1).nonzero()[0]
        if not len(breaks):  # one run: calm traffic
            score = 0.0
        else:
            inner = breaks[1:] - breaks[:-1]
            first = int(breaks[0]) + 1
            last = n - 1 - int(breaks[-1])
            score = float(1.0 - (int(inner @ inner) + first * first + last * last) / (n * n))
        self._score = score
        return score


_FEW_FREE = 64
"""below this many free blocks the score is taken in plain Python: a busy pool's free list is
short (half the reads of azure-conv x2 see fewer than 100), and there the fixed cost of numpy's
calls is most of the read (in the environment's loop, 8 against 15 us below 50 free blocks,
15 against 16 up to 100)"""


def _score_of_few(ids: list[int]) -> float:
    """fragmentation() of the sorted free ids ``ids`` (not empty), run by run in Python; the
    same integer sum and the same division as the numpy path, so the same float."""
    squares = 0
    run = 0
    prev = ids[0] - 1
    for b in ids:
        if b == prev + 1:
            run += 1
        else:
            squares += run * run
            run = 1
        prev = b
    n = len(ids)
    return 1.0 - (squares + run * run) / (n * n)


def _runs(ids: np.ndarray) -> np.ndarray:
    """Lengths of the runs of consecutive values in sorted distinct ``ids`` (not empty)."""
    breaks = (ids[1:] - ids[:-1] != 1).nonzero()[0]
    bounds = np.empty(len(breaks) + 2, dtype=np.int64)
    bounds[0] = -1
    bounds[1:-1] = breaks
    bounds[-1] = len(ids) - 1
    return bounds[1:] - bounds[:-1]
