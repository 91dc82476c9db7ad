"""SLO classes: per-class targets for time to first token and time per output token."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SloTarget:
    """Latency targets of one class. A request meets its SLO when both hold."""

    ttft_s: float
    """time to first token: first token time - arrival"""
    tpot_s: float
    """time per output token: (finish - first token) / (output tokens - 1)"""

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError(f"SLO targets must be positive, got ttft_s={self.ttft_s}, "
                             f"tpot_s={self.tpot_s}")


DEFAULT_SLO_CLASSES: dict[str, SloTarget] = {
    # A chat or code-completion user watching tokens stream: a second to the first token and a
    # stream at least as fast as reading speed (20 tokens/s).
    "interactive": SloTarget(ttft_s=1.0, tpot_s=0.05),
    # Offline or agent traffic that tolerates queueing.
    "batch": SloTarget(ttft_s=10.0, tpot_s=0.2),
}
DEFAULT_SLO_CLASS = "interactive"


def parse_slo_classes(text: str) -> dict[str, SloTarget]:
    """Parse ``name:ttft_s:tpot_s[,name:ttft_s:tpot_s...]``, e.g. ``interactive:1:0.05``."""
    classes: dict[str, SloTarget] = {}
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        fields = part.strip().split(":")
        if len(fields) != 3:
            raise ValueError(f"SLO class #{i + 1} {part!r}: expected name:ttft_s:tpot_s")
        name, ttft, tpot = fields
        try:
            classes[name] = SloTarget(float(ttft), float(tpot))
        except ValueError as e:
            raise ValueError(f"SLO class {name!r}: {e}") from None
    if not classes:
        raise ValueError("no SLO class given")
    return classes
