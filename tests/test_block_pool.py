"""The KV block pool never leaks, never hands out a block twice, and resizes without losing one."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runtime.engine.block_pool import _FEW_FREE, BlockPool


class PoolMachine(RuleBasedStateMachine):
    """Owners allocate and free blocks in any order while the pool grows and shrinks."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(32)
        self.owned: list[list[int]] = []

    @rule(n=st.integers(0, 40))
    def allocate(self, n: int) -> None:
        free_before = self.pool.num_free
        ids = self.pool.allocate(n)
        if n > free_before:
            assert ids is None and self.pool.num_free == free_before
        else:
            assert len(ids) == n
            self.owned.append(ids)

    @rule()
    def allocate_one(self) -> None:
        b = self.pool.allocate_one()
        if b is not None:
            self.owned.append([b])

    @precondition(lambda self: self.owned)
    @rule(i=st.integers(0, 1000))
    def free(self, i: int) -> None:
        self.pool.free(self.owned.pop(i % len(self.owned)))

    @rule(extra=st.integers(0, 16))
    def grow(self, extra: int) -> None:
        self.pool.grow(self.pool.num_blocks + extra)

    @rule(target_blocks=st.integers(1, 64))
    def shrink(self, target_blocks: int) -> None:
        # as the engine does: release owners (newest first) until the rest fits, then shrink
        target_blocks = min(target_blocks, self.pool.num_blocks)
        while self.pool.num_used > target_blocks:
            self.pool.free(self.owned.pop())
        moves = self.pool.shrink(target_blocks)
        assert all(src >= target_blocks > dst for src, dst in moves.items())
        self.owned = [[moves.get(b, b) for b in ids] for ids in self.owned]

    @invariant()
    def no_leak_no_double_ownership(self) -> None:
        used = [b for ids in self.owned for b in ids]
        free = self.pool.free_ids()
        assert len(used) == len(set(used)), "a block is owned twice"
        assert len(free) == len(set(free)), "a block is free twice"
        assert not set(used) & set(free), "a block is both owned and free"
        assert sorted(used + free) == list(range(self.pool.num_blocks)), "a block leaked"
        assert 0.0 <= self.pool.fragmentation() <= 1.0

    @invariant()
    def fragmentation_from_the_kept_array_equals_one_from_scratch(self) -> None:
        fresh = BlockPool(self.pool.num_blocks)
        fresh._free = self.pool.free_ids()  # a pool with no array kept converts the whole list
        assert self.pool.fragmentation() == fresh.fragmentation()
        assert self.pool.copy().fragmentation() == fresh.fragmentation()


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_lowest_free_ids_go_first_so_the_tail_stays_free():
    pool = BlockPool(8)
    assert sorted(pool.allocate(3)) == [0, 1, 2]
    assert pool.allocate_one() == 3


def test_shrink_refuses_while_more_blocks_are_in_use():
    pool = BlockPool(8)
    pool.allocate(6)
    with pytest.raises(ValueError, match="cannot shrink to 4 blocks with 6 in use"):
        pool.shrink(4)


def test_fragmentation_is_the_share_of_free_blocks_outside_one_run():
    pool = BlockPool(10)
    pool.allocate(10)
    pool.free([1, 2, 5, 6, 7])  # free runs of 2 and 3 blocks
    assert pool.fragmentation() == 1.0 - (2 * 2 + 3 * 3) / 5**2
    pool.free([3, 4])  # one run 1..7
    assert pool.fragmentation() == 0.0
    assert pool.allocate_one() == 4
    assert pool.fragmentation() == 1.0 - (3 * 3 + 3 * 3) / 6**2


def test_shrink_moves_used_blocks_below_the_cut():
    pool = BlockPool(8)
    ids = pool.allocate(8)
    pool.free([i for i in ids if i < 4])  # blocks 4..7 in use, 0..3 free
    moves = pool.shrink(4)
    assert sorted(moves) == [4, 5, 6, 7] and sorted(moves.values()) == [0, 1, 2, 3]
    assert pool.num_free == 0


def reference_fragmentation(free_ids: list[int]) -> float:
    """The score as DESIGN.md's formula reads, normalised by the free count: the runs of the
    sorted free ids, in plain Python."""
    ids = sorted(free_ids)
    if not ids:
        return 0.0
    runs = [1]
    for a, b in zip(ids, ids[1:]):
        if b == a + 1:
            runs[-1] += 1
        else:
            runs.append(1)
    return 1.0 - sum(r * r for r in runs) / (len(ids) * len(ids))


def reference_shrink(free: list[int], num_blocks: int, new_blocks: int
                     ) -> tuple[dict[int, int], list[int]]:
    """What shrink() does, as first written: the moves and the free list after."""
    free_set = set(free)
    used_above = [b for b in range(new_blocks, num_blocks) if b not in free_set]
    free_below = sorted(b for b in free if b < new_blocks)
    remap = dict(zip(used_above, free_below))
    return remap, [b for b in free_below if b not in set(remap.values())][::-1]


def test_fragmentation_equals_a_plain_reference_on_thousands_of_random_pools():
    """Pools driven as the engine drives them (allocations off the stack, requests' blocks
    freed in any order, growth and shrinkage), the score read at random moments: it is the
    reference's, to the bit, and so are a shrink's moves and free list."""
    rng = random.Random(11)
    reads = numpy_reads = 0
    for _ in range(3000):
        pool = BlockPool(rng.randint(1, 120))
        owned: list[list[int]] = []
        for _ in range(rng.randint(1, 25)):
            op = rng.random()
            if op < 0.4:
                ids = pool.allocate(rng.randint(1, 12))
                if ids is not None:
                    owned.append(ids)
            elif op < 0.5:
                b = pool.allocate_one()
                if b is not None and owned:  # a decode block joins a request's blocks
                    owned[rng.randrange(len(owned))].append(b)
                elif b is not None:
                    owned.append([b])
            elif op < 0.8 and owned:
                pool.free(owned.pop(rng.randrange(len(owned))))
            elif op < 0.9:
                pool.grow(pool.num_blocks + rng.randint(0, 20))
            else:
                target = rng.randint(max(1, pool.num_used), pool.num_blocks)
                expected = reference_shrink(pool.free_ids(), pool.num_blocks, target)
                moves = pool.shrink(target)
                assert (moves, pool.free_ids()) == expected
                assert list(moves) == list(expected[0])  # the same order, too
                owned = [[moves.get(b, b) for b in ids] for ids in owned]
            if rng.random() < 0.5:
                assert pool.fragmentation() == reference_fragmentation(pool.free_ids())
                reads += 1
                numpy_reads += pool.num_free >= _FEW_FREE
        assert pool.fragmentation() == reference_fragmentation(pool.free_ids())
    assert reads > 15000 and numpy_reads > 3000  # both paths, Python's and numpy's
