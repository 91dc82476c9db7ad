"""Reading a trace file of any supported format: detect the format, then call its reader."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from env.traces.azure import AZURE_COLUMNS, read_azure
from env.traces.burstgpt import BURSTGPT_COLUMNS, read_burstgpt
from env.traces.errors import TraceFormatError
from env.traces.mooncake import read_mooncake
from env.traces.plain_csv import PLAIN_COLUMNS, read_plain_csv
from env.traces.trace import Trace
from runtime.engine.slo import DEFAULT_SLO_CLASS

TRACE_READERS: dict[str, Callable[..., Trace]] = {
    "azure": read_azure,
    "mooncake": read_mooncake,
    "burstgpt": read_burstgpt,
    "plain": read_plain_csv,
}
"""format name -> reader; each reader takes the path and a keyword ``slo_class``"""

_CSV_FORMATS = (("azure", AZURE_COLUMNS), ("burstgpt", BURSTGPT_COLUMNS), ("plain", PLAIN_COLUMNS))
"""the CSV formats and the columns that identify them (no column is in two of them)"""
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def load_trace(path: str | Path, *, fmt: str | None = None,
               slo_class: str = DEFAULT_SLO_CLASS) -> Trace:
    """Read the trace in ``path``, its format given by ``fmt`` or detected (:func:`detect_format`).

    :param fmt: one of ``TRACE_READERS`` (azure, mooncake, burstgpt, plain), or None to detect.
    :param slo_class: the SLO class of every request that the file does not give one.
    """
    if fmt is None:
        fmt = detect_format(path)
    if fmt not in TRACE_READERS:
        raise ValueError(f"unknown trace format {fmt!r}; expected one of "
                         f"{', '.join(TRACE_READERS)}")
    return TRACE_READERS[fmt](path, slo_class=slo_class)


def detect_format(path: str | Path) -> str:
    """The format of ``path``, from its first line or, failing that, its extension.

    A first line that is a JSON object means mooncake. A CSV header means the format that has
    the most of its columns (so that a header missing one column still reaches its reader,
    which names the missing column). A file whose first line says nothing but whose extension
    is ``.jsonl``, ``.json`` or ``.ndjson`` is mooncake.
    """
    path = Path(path)
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        first_line = f.readline()
    if first_line.lstrip().startswith("{") or (
            path.suffix.lower() in _JSON_SUFFIXES and not first_line.strip()):
        return "mooncake"
    if not first_line:
        raise TraceFormatError(path, 1, None, "empty file; cannot tell the trace format")
    names = {name.strip() for name in next(csv.reader([first_line]), [])}
    shared, fmt = max((len(names.intersection(columns)), fmt) for fmt, columns in _CSV_FORMATS)
    if shared:
        return fmt
    if path.suffix.lower() in _JSON_SUFFIXES:
        return "mooncake"
    known = "; ".join(f"{fmt}: {','.join(columns)}" for fmt, columns in _CSV_FORMATS)
    raise TraceFormatError(
        path, 1, None, f"cannot tell the trace format from the first line "
        f"{first_line.strip()!r}: it has the columns of no known CSV format ({known}) and is no "
        "JSON object (mooncake); pass fmt= to choose a reader")
