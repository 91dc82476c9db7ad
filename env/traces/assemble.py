"""From the columns a reader parsed to a :class:`Trace`: skip rows by rule, sort, re-base time.

Every reader ends here, so every trace read from a file obeys the same rules: rows the engine
cannot serve are skipped and counted per reason, requests are in a stable arrival order (and
the source says how many rows the file had out of order), and the first request arrives at 0 s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from env.traces.errors import TraceFormatError
from env.traces.trace import Trace

ZERO_PROMPT_TOKENS = "zero_prompt_tokens (engine cannot serve)"
"""skip reason: a request with no prompt has nothing to prefill"""
ZERO_OUTPUT_TOKENS = "zero_output_tokens (engine cannot serve)"
"""skip reason: a request that generates no token has no first token and no TPOT"""
FAILED_REQUEST = "zero_response_tokens (failed request)"
"""skip reason (BurstGPT): the log records a failure as a response of zero tokens"""


def assemble_trace(path: Path, format_label: str, arrival_s: np.ndarray,
                   prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                   slo_class: np.ndarray, skip_rules: list[tuple[str, np.ndarray]],
                   end_line: int, time_origin: Callable[[float], str] | None = None) -> Trace:
    """A trace of the rows that no rule skips, sorted by arrival and re-based to start at 0.

    :param arrival_s: float64 seconds on any origin, in file order.
    :param slo_class: one class name per row.
    :param skip_rules: ``(reason, mask)`` pairs, checked in order; a row is counted under the
        first reason whose mask holds for it, so each skipped row is counted once.
    :param end_line: the 1-based line after the file's last row, named when no row is left.
    :param time_origin: names time 0 of the result in the file's own terms (e.g. a wall-clock
        time), given its ``arrival_s`` value, for the source line; by default that value.
    """
    keep = np.ones(len(arrival_s), dtype=bool)
    skipped: dict[str, int] = {}
    for reason, mask in skip_rules:
        hit = mask & keep
        if hit.any():
            skipped[reason] = int(hit.sum())
            keep &= ~hit
    if not keep.any():
        reasons = ", ".join(f"{n} {reason}" for reason, n in skipped.items())
        what = f"all {len(keep)} rows were skipped by rule: {reasons}" if len(keep) else \
            "the file has no rows"
        raise TraceFormatError(path, end_line, None, f"no requests: {what}")
    arrival_s = arrival_s[keep]
    order = np.argsort(arrival_s, kind="stable")
    num_moved = int(np.count_nonzero(order != np.arange(len(order))))
    start_s = float(arrival_s[order[0]])
    origin = time_origin(start_s) if time_origin else f"{start_s:g} s in the file"
    notes = [format_label, f"time 0 = {origin}"]
    if num_moved:
        notes.append(f"re-sorted: {num_moved} rows were out of arrival order")
    return Trace(name=path.stem, arrival_s=arrival_s[order] - start_s,
                 prompt_tokens=prompt_tokens[keep][order],
                 output_tokens=output_tokens[keep][order], slo_class=slo_class[keep][order],
                 source=f"{path} ({'; '.join(notes)})", skipped=skipped,
                 num_reordered=num_moved)


SLO_CLASS_COLUMN = "slo_class"
"""the optional column (CSV) or key (JSON lines) that gives a request its SLO class, in every
format"""


def default_classes(num_rows: int, slo_class: str) -> np.ndarray:
    """``slo_class`` for each of ``num_rows`` rows, as a numpy str array."""
    if not slo_class:
        raise ValueError("slo_class must be a non-empty class name")
    return np.full(num_rows, slo_class, dtype=f"<U{len(slo_class)}")
