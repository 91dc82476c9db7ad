"""SLO classes: per-class targets for time to first token and time per output token, or a
completion deadline.

Two kinds of class share the engine. An *interactive* class (no deadline) meets its SLO when its
first token comes within ``ttft_s`` of its arrival and its tokens stream at ``tpot_s`` or faster.
A *batch* class (``deadline_s`` set) meets it when the whole request finishes within
``deadline_s`` of its arrival; its TTFT and TPOT do not matter, so it may wait.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SloTarget:
    """Latency targets of one class. A request meets its SLO when both hold."""

    ttft_s: float
    """time to first token: first token time - arrival"""
    tpot_s: float
    """time per output token: (finish - first token) / (output tokens - 1)"""
    deadline_s: float | None = None
    """completion deadline from arrival; set for a batch class (its TTFT and TPOT are then not
    judged), None for an interactive one"""

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(f"SLO targets must be positive, got ttft_s={self.ttft_s}, "
                             f"tpot_s={self.tpot_s}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"SLO deadline_s must be positive or None, got {self.deadline_s}")

    @property
    def is_batch(self) -> bool:
        """A deferrable class, judged by its completion deadline."""
        return self.deadline_s is not None


BATCH_DEADLINE_S = 3600.0
"""the default batch class's completion deadline: an hour"""

DEFAULT_SLO_CLASSES: dict[str, SloTarget] = {
    # A chat or code-completion user watching tokens stream: a second to the first token and a
    # stream at least as fast as reading speed (20 tokens/s).
    "interactive": SloTarget(ttft_s=1.0, tpot_s=0.05),
    # Offline jobs (evaluations, summarisation, synthetic data) submitted in drops: done within
    # the hour is on time, however long each waits. TTFT and TPOT are not judged; the values
    # only bound the ratios the interval stats report.
    "batch": SloTarget(ttft_s=BATCH_DEADLINE_S, tpot_s=1.0, deadline_s=BATCH_DEADLINE_S),
}
DEFAULT_SLO_CLASS = "interactive"
BATCH_SLO_CLASS = "batch"


def parse_slo_classes(text: str) -> dict[str, SloTarget]:
    """Parse ``name:ttft_s:tpot_s[:deadline_s][,...]``, e.g. ``interactive:1:0.05`` or
    ``batch:3600:1:3600`` (a batch class with an hour's completion deadline)."""
    classes: dict[str, SloTarget] = {}
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        fields = part.strip().split(":")
        if len(fields) not in (3, 4):
            raise ValueError(f"SLO class #{i + 1} {part!r}: expected "
                             "name:ttft_s:tpot_s[:deadline_s]")
        name, ttft, tpot = fields[:3]
        try:
            deadline = float(fields[3]) if len(fields) == 4 else None
            classes[name] = SloTarget(float(ttft), float(tpot), deadline)
        except ValueError as e:
            raise ValueError(f"SLO class {name!r}: {e}") from None
    if not classes:
        raise ValueError("no SLO class given")
    return classes
