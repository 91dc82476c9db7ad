"""Who decided over the last minute: decisions by source and fallback reason, in one-second
buckets, so that ``/readyz`` and ``GET /v1/policy`` report what actually decides rather than what
is loaded (a loaded policy whose every answer is refused is not deciding)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from runtime.decider.decision import SOURCES, Source

WINDOW_S = 60
"""the span of the window, in seconds"""


class DecisionWindow:
    """Counts of decisions over the last ``span_s`` seconds of ``clock``, kept in a ring of
    one-second buckets (fixed memory however long the process runs).

    :param span_s: the window, in whole seconds
    :param clock: seconds, monotonic
    """

    def __init__(self, span_s: int = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        if span_s < 1:
            raise ValueError(f"span_s must be >= 1 second, got {span_s}")
        self.span_s = span_s
        self.clock = clock
        self._lock = threading.Lock()
        self._second = [-1] * span_s  # the second each bucket holds
        self._by_source: list[dict[Source, int]] = [dict.fromkeys(SOURCES, 0)
                                                     for _ in range(span_s)]
        self._by_reason: list[dict[str, int]] = [{} for _ in range(span_s)]

    def record(self, source: Source, reason: str | None, n: int = 1) -> None:
        """Count ``n`` decisions made now by ``source`` (with the fallback ``reason``)."""
        second = int(self.clock())
        i = second % self.span_s
        with self._lock:
            if self._second[i] != second:
                self._second[i] = second
                self._by_source[i] = dict.fromkeys(SOURCES, 0)
                self._by_reason[i] = {}
            self._by_source[i][source] += n
            if reason is not None:
                reasons = self._by_reason[i]
                reasons[reason] = reasons.get(reason, 0) + n

    def summary(self) -> dict:
        """``decisions``, ``by_source``, ``fallback_share`` (decisions not made by the policy
        over all, 0.0 when there were none), ``source`` (the one that made most decisions, None
        when there were none) and ``top_reason`` (the commonest fallback reason, or None)."""
        now = int(self.clock())
        by_source = dict.fromkeys(SOURCES, 0)
        reasons: dict[str, int] = {}
        with self._lock:
            for i in range(self.span_s):
                if now - self._second[i] < self.span_s:
                    for s, n in self._by_source[i].items():
                        by_source[s] += n
                    for r, n in self._by_reason[i].items():
                        reasons[r] = reasons.get(r, 0) + n
        total = sum(by_source.values())
        return {
            "window_s": self.span_s,
            "decisions": total,
            "by_source": by_source,
            "fallback_share": (total - by_source["policy"]) / total if total else 0.0,
            "source": max(by_source, key=by_source.__getitem__) if total else None,
            "top_reason": max(reasons, key=reasons.__getitem__) if reasons else None,
        }
