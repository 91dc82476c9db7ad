"""The paged KV block pool: ids ``0 .. num_blocks-1``, allocation of the lowest free ids first.

Lowest-first keeps the tail of the pool free, so that shrinking it (a lower ``kv_cache_ratio``)
rarely has blocks to move. Freed blocks are reused last-in first-out. The free ids live in a
numpy stack (``_stack[:_top]``, the next block handed out on top): allocation and release are
slice copies, and the fragmentation score, which the controller observes every interval, sorts
the stack in place of converting a Python list.
"""

from __future__ import annotations

import numpy as np


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least 1 block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._stack = np.arange(num_blocks - 1, -1, -1, dtype=np.int32)
        self._top = num_blocks

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def num_used(self) -> int:
        return self.num_blocks - self._top

    def utilization(self) -> float:
        return 1.0 - self._top / self.num_blocks

    def allocate(self, n: int) -> list[int] | None:
        """Hand out ``n`` blocks, or None (and nothing) when fewer than ``n`` are free."""
        top = self._top
        if n > top:
            return None
        if n <= 0:
            return []
        self._top = top - n
        return self._stack[top - n:top].tolist()

    def allocate_one(self) -> int | None:
        """One block, or None when none is free (the decode path: one token at a time)."""
        if not self._top:
            return None
        self._top -= 1
        return int(self._stack[self._top])

    def free(self, ids: list[int]) -> None:
        n = len(ids)
        if n:
            self._stack[self._top:self._top + n] = ids
            self._top += n

    def free_ids(self) -> list[int]:
        return self._stack[:self._top].tolist()

    def grow(self, num_blocks: int) -> None:
        """Add ids ``self.num_blocks .. num_blocks-1``; they are handed out after the old ones."""
        if num_blocks < self.num_blocks:
            raise ValueError(f"grow() to {num_blocks} blocks from {self.num_blocks}: use shrink()")
        new = np.arange(num_blocks - 1, self.num_blocks - 1, -1, dtype=np.int32)
        stack = np.empty(num_blocks, dtype=np.int32)
        stack[:len(new)] = new
        stack[len(new):len(new) + self._top] = self._stack[:self._top]
        self._stack = stack
        self._top += len(new)
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
        free = self._stack[:self._top]
        is_free = np.zeros(self.num_blocks, dtype=bool)
        is_free[free] = True
        used_above = np.flatnonzero(~is_free[num_blocks:]) + num_blocks
        free_below = np.flatnonzero(is_free[:num_blocks])  # ascending
        moves = dict(zip(used_above.tolist(), free_below[:len(used_above)].tolist()))
        remaining = free_below[len(used_above):]
        self._stack = np.empty(num_blocks, dtype=np.int32)
        self._stack[:len(remaining)] = remaining[::-1]
        self._top = len(remaining)
        self.num_blocks = num_blocks
        return moves

    def free_gaps(self) -> np.ndarray:
        """Sizes of the maximal runs of contiguous free block ids."""
        n = self._top
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        ids = np.sort(self._stack[:n])
        ends = np.flatnonzero(np.diff(ids) != 1)
        bounds = np.empty(len(ends) + 2, dtype=np.int64)
        bounds[0] = -1
        bounds[1:-1] = ends
        bounds[-1] = n - 1
        return np.diff(bounds)

    def fragmentation(self) -> float:
        """0 when the free blocks form one contiguous run, towards 1 as they scatter.

        ``1 - sum(gap^2) / free^2``. DESIGN.md's raw ``sum(gap^2) / pool^2`` also falls as the
        pool fills, which mixes utilisation into it; normalising by the free count keeps the
        two signals apart (utilisation is its own observation field). An empty free list is 0.
        """
        n = self._top
        if n == 0:
            return 0.0
        gaps = self.free_gaps()
        return float(1.0 - np.dot(gaps, gaps) / (n * n))
