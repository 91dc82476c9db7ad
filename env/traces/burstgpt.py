"""Reader of BurstGPT traces (Azure OpenAI GPT usage logs).

Columns used: ``Timestamp`` (seconds from the start of the log), ``Request tokens`` (prompt
tokens), ``Response tokens`` (output tokens). Others (``Model``, ``Total tokens``,
``Log Type``, ...) are ignored. A row with zero response tokens records a failed request.
"""

from __future__ import annotations

from pathlib import Path

from env.traces.assemble import (
    FAILED_REQUEST,
    SLO_CLASS_COLUMN,
    ZERO_PROMPT_TOKENS,
    assemble_trace,
    default_classes,
)
from env.traces.csv_columns import parse_counts, parse_names, parse_seconds, read_csv_columns
from env.traces.trace import Trace
from runtime.engine.slo import DEFAULT_SLO_CLASS

BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
"""the columns the reader needs; the header may hold others"""


def read_burstgpt(path: str | Path, *, slo_class: str = DEFAULT_SLO_CLASS) -> Trace:
    """Read a BurstGPT CSV; arrivals in seconds from its first served request.

    :param slo_class: the SLO class of every request when the file has no ``slo_class``
        column; a file that has one gives each request its own (an empty one is refused).
    Failed requests (zero response tokens) are skipped by rule, and so are requests with zero
    request tokens; both are counted in ``skipped``, a failure under the failure reason even
    when its request tokens are zero too.
    """
    path = Path(path)
    table = read_csv_columns(path, BURSTGPT_COLUMNS, (SLO_CLASS_COLUMN,))
    arrival_s = parse_seconds(table, "Timestamp")
    prompt_tokens = parse_counts(table, "Request tokens")
    output_tokens = parse_counts(table, "Response tokens")
    return assemble_trace(
        path, "BurstGPT CSV", arrival_s, prompt_tokens, output_tokens,
        (parse_names(table, SLO_CLASS_COLUMN) if SLO_CLASS_COLUMN in table.values
         else default_classes(len(table), slo_class)),
        skip_rules=[(FAILED_REQUEST, output_tokens == 0),
                    (ZERO_PROMPT_TOKENS, prompt_tokens == 0)],
        end_line=table.end_line)
