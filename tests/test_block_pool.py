"""The KV block pool never leaks, never hands out a block twice, and resizes without losing one."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runtime.engine.block_pool import BlockPool


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
