"""Policy files the server has refused, remembered by what the file system says of them.

A reload of a file that looks like an ONNX model but is not one costs the batch worker tens of
milliseconds of onnxruntime (an 8 MB file one byte under the size limit: 20-80 ms), and that
stage cannot be cut into turns: a client with the reload token sending such a reload back to
back kept the worker busy, and every other client's large batches waited behind it (their p99
9.8-16.9 times their p99 alone). A file that is refused once is refused again, to the byte, as
long as it has not changed, so the server remembers the refusal under the file's identity and
change stamps (:func:`fingerprint`: device, inode, size, modification and status-change times)
and answers a reload of the unchanged file from memory, in microseconds, counted and reported as
every refusal is. Any change to the file (written, replaced, its permissions changed) changes
its status-change time, which no client can set back, so a fixed file is read again at once.

The file system stamps times from a coarse clock (a few milliseconds), so a file rewritten in
place within one tick of an earlier write keeps its stamps. As git does with its index, a
refusal is remembered only for a file whose last change is at least :data:`SETTLED_S` older than
the reload that read it: a change after that shows in the stamps. A file changed just before it
was refused is read again at its next reload (and remembered then, once it has settled).

A refusal answered from memory is answered late, as every reload refused without reading a
file is (``UNREAD_REFUSAL_DELAY_S`` in :mod:`runtime.api.routes.policy`).

Only refusals of what a file holds are remembered: a missing file is not (it has no identity),
and a worker that could not answer refused nothing.
"""

from __future__ import annotations

import os
import stat
import time
from collections import OrderedDict
from pathlib import Path

from runtime.decider.decision import MODEL_MISSING
from runtime.decider.onnx_policy import PolicyLoadError

SETTLED_S = 1.0
"""a refusal is remembered only for a file last changed at least this long before it was read"""
MAX_REMEMBERED = 64
"""refusals kept (the least recently asked for is forgotten first)"""
UNCHANGED_NOTE = " (unchanged since it was refused)"
"""added to the message of a refusal answered from memory"""

Fingerprint = tuple[int, int, int, int, int]
"""(device, inode, size, modification time, status-change time), in nanoseconds"""


def fingerprint(path: Path) -> Fingerprint | None:
    """The identity and change stamps of the regular file at ``path``, taken before it is read
    (None: no such file, not a regular file, which the loader refuses on its own, or a file
    changed less than :data:`SETTLED_S` ago, whose stamps may not show its next change)."""
    now_ns = time.time_ns()
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    if now_ns - max(info.st_mtime_ns, info.st_ctime_ns) < SETTLED_S * 1e9:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class RefusedFiles:
    """The refusals of the last :data:`MAX_REMEMBERED` files refused, by :func:`fingerprint`."""

    def __init__(self, size: int = MAX_REMEMBERED) -> None:
        if size < 1:
            raise ValueError(f"RefusedFiles needs room for at least 1 refusal, got {size}")
        self.size = size
        self._refusals: OrderedDict[Fingerprint, tuple[str, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._refusals)

    def refusal(self, key: Fingerprint | None, path: Path) -> PolicyLoadError | None:
        """The refusal of the unchanged file ``key`` names, for a reload of ``path`` (None: not
        refused before, or changed since)."""
        if key is None:
            return None
        known = self._refusals.get(key)
        if known is None:
            return None
        self._refusals.move_to_end(key)
        reason, message = known
        return PolicyLoadError(reason, message + UNCHANGED_NOTE, path)

    def remember(self, key: Fingerprint | None, error: PolicyLoadError) -> None:
        """Remember that the file ``key`` names was refused with ``error`` (a missing file is
        not remembered)."""
        if key is None or error.reason == MODEL_MISSING:
            return
        message = error.message.removesuffix(UNCHANGED_NOTE)
        self._refusals[key] = (error.reason, message)
        self._refusals.move_to_end(key)
        while len(self._refusals) > self.size:
            self._refusals.popitem(last=False)
