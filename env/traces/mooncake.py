"""Reader of Mooncake traces: JSON lines with ``timestamp`` in ms from the start.

Each line is one object: ``timestamp`` (milliseconds from the start of the trace),
``input_length`` (prompt tokens), ``output_length`` (output tokens), and optionally
``slo_class`` (the request's SLO class name), ``hash_ids`` (prefix-cache block ids, ignored
here) or other keys (ignored). Some of Mooncake's traces have quantised timestamps (the
conversation trace's come in 3 s steps, up to 18 requests to an instant; the synthetic trace's do
not): the reader detects it (:func:`env.traces.transforms.quantisation_step`), says so in the
trace's ``source`` and sets ``timestamp_step_s``, and :func:`env.traces.resolve.resolve_trace`
spreads such arrivals within their step by default.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from env.traces.assemble import (
    SLO_CLASS_COLUMN,
    ZERO_OUTPUT_TOKENS,
    ZERO_PROMPT_TOKENS,
    assemble_trace,
    default_classes,
)
from env.traces.errors import TraceFormatError, shown
from env.traces.trace import Trace
from env.traces.transforms import quantisation_step
from runtime.engine.engine import MAX_ARRIVAL_S
from runtime.engine.slo import DEFAULT_SLO_CLASS

MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
"""the keys every line must have"""


def read_mooncake(path: str | Path, *, slo_class: str = DEFAULT_SLO_CLASS) -> Trace:
    """Read a Mooncake JSONL trace; arrivals in seconds from its first request.

    :param slo_class: the SLO class of a request whose line has no ``slo_class`` key.
    Lines are numbered from 1 (there is no header). Blank lines at the end are ignored; a blank
    line before a request is refused. Requests with zero input or output length are skipped by
    rule and counted in ``skipped``.
    """
    path = Path(path)
    timestamps_ms: list[float] = []
    prompt_tokens: list[int] = []
    output_tokens: list[int] = []
    classes: list[str] = []
    default_classes(0, slo_class)  # refuses an empty default now
    blank_line = 0
    with open(path, encoding="utf-8-sig") as f:
        line_number = 0
        try:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    blank_line = blank_line or line_number
                    continue
                if blank_line:
                    raise TraceFormatError(path, blank_line, None,
                                           f"blank line before the request on line {line_number}")
                record = _parse_line(path, line_number, line)
                timestamps_ms.append(_milliseconds(path, line_number, record, "timestamp"))
                prompt_tokens.append(_count(path, line_number, record, "input_length"))
                output_tokens.append(_count(path, line_number, record, "output_length"))
                classes.append(_class_name(path, line_number, record, slo_class))
        except UnicodeDecodeError:
            raise TraceFormatError.not_utf8(path) from None
    if not line_number:
        raise TraceFormatError(path, 1, None, "empty file; expected JSON lines with keys "
                               + ", ".join(MOONCAKE_KEYS))
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    output = np.asarray(output_tokens, dtype=np.int64)
    trace = assemble_trace(
        path, "Mooncake JSONL", np.asarray(timestamps_ms, dtype=np.float64) / 1000.0, prompt,
        output, np.asarray(classes, dtype=str),
        skip_rules=[(ZERO_PROMPT_TOKENS, prompt == 0), (ZERO_OUTPUT_TOKENS, output == 0)],
        end_line=len(prompt) + 1)
    step_s = quantisation_step(trace.arrival_s)
    if not step_s:
        return trace
    distinct = len(np.unique(trace.arrival_s))
    return dataclasses.replace(
        trace, timestamp_step_s=step_s,
        source=f"{trace.source} (timestamps quantised to {step_s:g} s steps: {distinct} "
               f"instants for {len(trace)} requests, at most "
               f"{int(np.unique(trace.arrival_s, return_counts=True)[1].max())} at one)")


def _parse_line(path: Path, line_number: int, line: str) -> dict:
    try:
        record = json.loads(line.rstrip("\r\n"))  # so that a column past the end is on this line
    except json.JSONDecodeError as e:
        raise TraceFormatError(path, line_number, str(e.colno), f"invalid JSON: {e.msg}") from None
    except RecursionError:
        raise TraceFormatError(path, line_number, None,
                               "invalid JSON: nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise TraceFormatError(path, line_number, None, f"invalid JSON: {e}") from None
    if not isinstance(record, dict):
        raise TraceFormatError(path, line_number, None,
                               f"expected a JSON object, got {type(record).__name__}")
    return record


def _value(path: Path, line_number: int, record: dict, key: str) -> object:
    if key not in record:
        raise TraceFormatError(path, line_number, key,
                               f"missing (the object has {', '.join(record) or 'no keys'})")
    return record[key]


def _milliseconds(path: Path, line_number: int, record: dict, key: str) -> float:
    value = _value(path, line_number, record, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise TraceFormatError(path, line_number, key, "expected a non-negative number of "
                               f"milliseconds, got {shown(value)}")
    if not value / 1000.0 <= MAX_ARRIVAL_S:
        raise TraceFormatError(path, line_number, key,
                               f"{value:g} ms is past the engine's limit of {MAX_ARRIVAL_S:g} s")
    return float(value)


def _class_name(path: Path, line_number: int, record: dict, default: str) -> str:
    value = record.get(SLO_CLASS_COLUMN, default)
    if not isinstance(value, str) or not value.strip():
        raise TraceFormatError(path, line_number, SLO_CLASS_COLUMN,
                               f"expected a class name, got {value!r}")
    return value.strip()


def _count(path: Path, line_number: int, record: dict, key: str) -> int:
    value = _value(path, line_number, record, key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**50:
        raise TraceFormatError(path, line_number, key,
                               f"expected a non-negative integer, got {shown(value)}")
    return value
