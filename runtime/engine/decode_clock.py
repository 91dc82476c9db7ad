"""The lazy decode clock: every running decode gains one token an iteration, so the engine counts
iterations once (``_clock``) instead of walking its decodes every iteration.

A request that decodes is *registered* with the clock: its token counts are exact at
``synced_at`` and lag the clock by ``_clock - synced_at`` (one token an iteration each, computed
and output). What the decodes need from the clock's readers is kept where it changes, not
summed:

- their context (``_ctx``, the sum of ``num_computed_tokens + 1``: what a decode attends to,
  the new token included) grows by the number of decodes an iteration;
- their next completions: a heap of ``(clock at which it ends, order, request)``, entries of
  requests no longer registered under that order left in it and skipped;
- their block needs: a decode needs a fresh KV block at the iteration that starts with its
  computed tokens a multiple of the block size, so at one clock residue modulo the block size,
  for as long as it decodes: ``_buckets[residue]`` holds the decodes of each residue, and an
  iteration's needs are the buckets of its residues, taken in running order (``order``). A
  request registered with a whole block in hand (a recompute left one token short on a block
  boundary) skips its first residue: it waits in ``_deferred`` for one iteration block.

The requests still prefilling are kept in running order (``_prefill_list``). The counts stay
lagging from one ``run_until`` to the next: closing an interval reads none of them (its batch
backlog adds the lag), so an environment step does not walk the running decodes. What reads
them brings them up to date first (:meth:`_clock_sync`): ``Engine.requests``, the way a reader
outside the engine sees requests, ``state_key``, ``fork``, a preemption (its victim's), the
step-by-step path and ``abort_all``. The structures are built from the requests when first
needed (``_lazy`` False: after a fork, a step-by-step iteration, an abort) and kept up to date
from then on by admission, preemption, shedding and the loop itself.
"""

from __future__ import annotations

import heapq
from operator import attrgetter

from runtime.engine.request import Request
from runtime.engine.state import EngineState

BATCH_ORDER = 1 << 48
"""added to a batch request's admission number in ``Request.order``: batch requests run after
every interactive one"""

order_of = attrgetter("order")
"""a request's place in the running order"""


class DecodeClockMixin(EngineState):
    """:class:`~runtime.engine.engine.Engine`'s lazy decode clock (see the module)."""

    def _clock_build(self) -> None:
        """Register every running decode at the clock now (their counts are exact) and list the
        prefilling requests."""
        bs = self.block_size
        now = self._clock
        buckets: list[list[Request]] = [[] for _ in range(bs)]
        deferred: list[Request] = []
        ends = []
        prefilling = []
        ctx = 0
        for r in self.running:
            out = r.num_output_tokens
            c = r.num_computed_tokens
            if out and r.prompt_tokens + out - c == 1:
                r.synced_at = now
                ctx += c + 1
                ends.append((now + r.output_tokens - out, r.order, r))
                off = len(r.block_ids) * bs - c
                if off < bs:
                    buckets[(now + off) % bs].append(r)
                else:
                    deferred.append(r)
            else:
                r.synced_at = -1
                prefilling.append(r)
        heapq.heapify(ends)
        self._buckets = buckets
        self._buckets2 = buckets * 2  # the same lists twice: a window of residues is a slice
        self._deferred = deferred
        self._ends = ends
        self._prefill_list = prefilling
        self._ctx = ctx
        self._lazy = True

    def _clock_sync(self, drop: bool = False) -> None:
        """Bring every registered request's counts up to date; with ``drop``, unregister them
        all and drop the structures (the step-by-step path changes counts on its own)."""
        if not self._lazy:
            return  # nothing is registered without the structures
        now = self._clock
        for r in self.running:
            s = r.synced_at
            if s >= 0:
                if s != now:
                    d = now - s
                    r.num_computed_tokens += d
                    r.num_output_tokens += d
                r.synced_at = -1 if drop else now
        if drop:
            self._lazy = False
            self._buckets = self._buckets2 = []
            self._deferred = []
            self._ends = []
            self._prefill_list = []
            self._ctx = 0

    def _unregister(self, r: Request) -> None:
        """Take registered ``r`` off the clock, its counts brought up to date (it is preempted,
        or finishes)."""
        now = self._clock
        s = r.synced_at
        c = r.num_computed_tokens
        residue = (s - c) % self.block_size
        if s != now:
            r.num_computed_tokens = c = c + now - s
            r.num_output_tokens += now - s
        self._ctx -= c + 1
        r.synced_at = -1
        deferred = self._deferred
        if deferred and r in deferred:
            deferred.remove(r)
        else:
            self._buckets[residue].remove(r)

    def _register(self, r: Request) -> None:
        """Put ``r``, now a decode with exact counts, on the clock."""
        now = self._clock
        bs = self.block_size
        c = r.num_computed_tokens
        r.synced_at = now
        self._ctx += c + 1
        heapq.heappush(self._ends, (now + r.output_tokens - r.num_output_tokens, r.order, r))
        off = len(r.block_ids) * bs - c
        if off < bs:
            self._buckets[(now + off) % bs].append(r)
        else:
            self._deferred.append(r)

    def _block_offset(self, j: int) -> int:
        """The ``j``-th smallest (from 0) of the registered decodes' iterations until each next
        needs a block: a walk over the residues, not over the decodes."""
        now = self._clock
        bs = self.block_size
        buckets = self._buckets
        for i in range(bs):
            j -= len(buckets[(now + i) % bs])
            if j < 0:
                return i
        assert j < len(self._deferred), "fewer registered decodes than asked for"
        return bs  # a deferred one: a whole block in hand

    def _crossings(self, k: int) -> list[tuple[Request, int]]:
        """The registered decodes that need blocks in the next ``k`` iterations, each with how
        many, in running order (a stretch of a block or more with deferred decodes, a step at a
        block size of 1)."""
        now = self._clock
        bs = self.block_size
        buckets = self._buckets
        out: list[tuple[Request, int]] = []
        for i in range(min(k, bs)):
            m = (k - 1 - i) // bs + 1
            out.extend((r, m) for r in buckets[(now + i) % bs])
        if k > bs:
            m = (k - 1 - bs) // bs + 1
            out.extend((r, m) for r in self._deferred)
        out.sort(key=_pair_order)
        return out


def _pair_order(pair: tuple[Request, int]) -> int:
    return pair[0].order
