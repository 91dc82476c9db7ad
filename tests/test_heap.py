"""The heap trimmer: when it trims, and that a trim gives free pages back."""

from __future__ import annotations

import sys
import time

import pytest

from runtime.api.heap import HeapTrimmer, resident_bytes
from runtime.steady_cpu import trim_heap

MIB = 2**20


class _Fake:
    def __init__(self) -> None:
        self.rss = 100 * MIB
        self.now = 0.0
        self.trimmed = 0

    def trim(self) -> bool:
        self.trimmed += 1
        self.rss = 101 * MIB  # what is still held
        return True


def _trimmer(fake: _Fake) -> HeapTrimmer:
    return HeapTrimmer(growth_bytes=4 * MIB, interval_s=1.0, resident=lambda: fake.rss,
                       trim=fake.trim, clock=lambda: fake.now)


def test_it_trims_after_growth_at_most_once_an_interval():
    fake = _Fake()
    t = _trimmer(fake)
    fake.rss += 3 * MIB
    assert not t.maybe_trim()  # not grown enough
    fake.rss += 2 * MIB
    assert t.maybe_trim() and fake.trimmed == 1 and t.level == 101 * MIB
    fake.rss = 110 * MIB
    assert t.wait_s() == 1.0 and not t.maybe_trim()  # grown, but within the interval
    fake.now = 1.0
    assert t.maybe_trim() and fake.trimmed == 2


def test_growth_counts_from_where_it_shrank_to():
    fake = _Fake()
    t = _trimmer(fake)
    fake.rss = 90 * MIB  # gave memory back on its own
    assert not t.grown()
    fake.rss = 94 * MIB
    assert t.grown()


def test_without_a_resident_size_it_never_trims():
    fake = _Fake()
    t = HeapTrimmer(growth_bytes=1, resident=lambda: None, trim=fake.trim, clock=lambda: 5.0)
    assert not t.maybe_trim() and fake.trimmed == 0


def test_its_thread_trims_a_process_that_grew():
    fake = _Fake()
    t = HeapTrimmer(growth_bytes=4 * MIB, interval_s=0.01, resident=lambda: fake.rss,
                    trim=fake.trim)
    fake.rss += 10 * MIB
    assert t.start().daemon
    deadline = time.monotonic() + 10
    while fake.trimmed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.trimmed == 1 and t.trims == 1  # and not again: it has not grown since


@pytest.mark.skipif(not sys.platform.startswith("linux") or resident_bytes() is None
                    or not trim_heap(), reason="glibc's malloc_trim and /proc")
def test_a_trim_gives_back_the_holes_between_blocks_in_use():
    """64 MiB in 1 KiB blocks (malloc's, not Python's small-object arenas), all but one in 64
    freed: the heap keeps its size (the blocks left pin it), and a trim gives the holes back."""
    blocks = [bytearray(1024) for _ in range(64 * 1024)]
    kept = blocks[::64]
    del blocks
    held = resident_bytes()
    trim_heap()
    after = resident_bytes()
    assert held is not None and after is not None
    assert held - after > 32 * MIB, (held / MIB, after / MIB)
    del kept


def test_the_c_library_is_looked_up_once(monkeypatch):
    """``find_library`` runs ``ldconfig`` in a child process: the trimmer, once a second in
    every server process, ran it at every trim at first."""
    import ctypes.util

    from runtime import steady_cpu

    calls = []
    real = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: calls.append(name) or real(name))
    steady_cpu._c_library.cache_clear()
    for _ in range(3):
        trim_heap()
    assert len(calls) == 1


def test_start_up_objects_are_frozen_out_of_the_collectors_reach():
    import gc

    from runtime.api.heap import freeze_start_up_objects

    survivor = [object() for _ in range(1000)]
    try:
        frozen = freeze_start_up_objects()
        assert frozen == gc.get_freeze_count() and frozen >= len(survivor)
        assert not any(o is survivor for o in gc.get_objects())  # no longer walked
    finally:
        gc.unfreeze()
    assert any(o is survivor for o in gc.get_objects())


def test_a_serving_process_freezes_what_it_built_before_serving():
    """The server and the batch worker's lanes: a full collection no longer walks the app, the
    decider and the schemas (28-42 ms with the event loop stopped, measured in a soak)."""
    import subprocess

    code = ("import gc, runtime.api.lane as w, runtime.api.heap as h\n"
            "calls = []\n"
            "h_freeze = h.freeze_start_up_objects\n"
            "w.freeze_start_up_objects = lambda: calls.append(h_freeze())\n"
            "import socket\n"
            "a, b = socket.socketpair()\n"
            "b.close()\n"
            "w.main([str(a.detach()), '0'])\n"
            "print(len(calls), calls[0] > 10000)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["1", "True"]


def test_the_batch_worker_imports_no_pydantic_until_a_body_needs_its_errors():
    """pydantic and the request schemas name a refused body's errors; a lane that sees only
    valid bodies never loads them (about 14 MB of each lane's resident size)."""
    import subprocess

    code = ("import json, sys, runtime.api.lane\n"
            "from runtime.api.parsing import BodyErrors, parse_batch\n"
            "from runtime.observation import example_fields\n"
            "before = 'pydantic' in sys.modules\n"
            "row = dict(example_fields(), ooms='x')\n"
            "try:\n"
            "    parse_batch(json.dumps({'observations': [row]}).encode(), {})\n"
            "except BodyErrors as e:\n"
            "    named = bool(e.errors)\n"
            "print(before, 'pydantic' in sys.modules, named)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["False", "True", "True"]
