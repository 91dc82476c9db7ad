"""Reader of the project's plain CSV traces: ``arrival_s,prompt_tokens,output_tokens[,slo_class]``.

The format to write a trace in by hand or from another tool. The columns may come in any
order; a column outside these four is refused (so a misspelt ``slo_class`` is not silently
ignored).
"""

from __future__ import annotations

from pathlib import Path

from env.traces.assemble import (
    SLO_CLASS_COLUMN,
    ZERO_OUTPUT_TOKENS,
    ZERO_PROMPT_TOKENS,
    assemble_trace,
    default_classes,
)
from env.traces.csv_columns import parse_counts, parse_names, parse_seconds, read_csv_columns
from env.traces.trace import Trace
from runtime.engine.slo import DEFAULT_SLO_CLASS

PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
"""the columns every plain CSV has"""
PLAIN_OPTIONAL_COLUMNS = (SLO_CLASS_COLUMN,)
"""the column a plain CSV may add"""


def read_plain_csv(path: str | Path, *, slo_class: str = DEFAULT_SLO_CLASS) -> Trace:
    """Read a plain CSV; ``arrival_s`` is seconds (>= 0), re-based so the first request is at 0.

    :param slo_class: the SLO class of every request when the file has no ``slo_class``
        column; a file that has one gives each request its own (an empty one is refused).
    Rows with zero prompt or output tokens are skipped by rule and counted in ``skipped``.
    """
    path = Path(path)
    table = read_csv_columns(path, PLAIN_COLUMNS, PLAIN_OPTIONAL_COLUMNS,
                             allow_other_columns=False)
    arrival_s = parse_seconds(table, "arrival_s")
    prompt_tokens = parse_counts(table, "prompt_tokens")
    output_tokens = parse_counts(table, "output_tokens")
    classes = (parse_names(table, SLO_CLASS_COLUMN) if SLO_CLASS_COLUMN in table.values
               else default_classes(len(table), slo_class))
    return assemble_trace(
        path, "plain CSV", arrival_s, prompt_tokens, output_tokens, classes,
        skip_rules=[(ZERO_PROMPT_TOKENS, prompt_tokens == 0),
                    (ZERO_OUTPUT_TOKENS, output_tokens == 0)],
        end_line=table.end_line)


def write_plain_csv(trace: Trace, path: str | Path, *, classes: bool | None = None) -> Path:
    """Write ``trace`` as a plain CSV that :func:`read_plain_csv` reads back to the same
    requests (arrival times to the last bit). ``classes``: write the ``slo_class`` column
    (default: when any request is not of the default class)."""
    path = Path(path)
    if classes is None:
        classes = bool(len(trace)) and bool((trace.slo_class != DEFAULT_SLO_CLASS).any())
    head = ",".join(PLAIN_COLUMNS + (PLAIN_OPTIONAL_COLUMNS if classes else ()))
    rows = zip(trace.arrival_s.tolist(), trace.prompt_tokens.tolist(),
               trace.output_tokens.tolist(), trace.slo_class.tolist())
    path.write_text(head + "\n" + "".join(
        f"{a!r},{p},{o}" + (f",{c}\n" if classes else "\n") for a, p, o, c in rows))
    return path
