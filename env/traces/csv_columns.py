"""Reading a CSV trace file into named string columns, and turning those into numpy arrays.

Every problem is raised as a :class:`TraceFormatError` naming the file, the line and the column.
The readers of the CSV formats (Azure, BurstGPT, plain) share this; each knows its own columns.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from env.traces.errors import TraceFormatError, shown
from runtime.engine.engine import MAX_ARRIVAL_S

_COUNTS = re.compile(r"(?:\d{1,15}\n)*\d{1,15}")
"""one or more non-negative integers of at most 15 digits, a line each (more would be no token
count, and could overflow int64 sums)"""
_COUNT = re.compile(r"\d{1,15}")
"""one such integer"""


@dataclass(frozen=True)
class CsvColumns:
    """The wanted columns of a CSV file, as the strings the file holds."""

    path: Path
    header: list[str]
    """every column name in the header, stripped of surrounding spaces"""
    values: dict[str, list[str]]
    """the wanted columns that the header has: one string per data row"""
    line_numbers: np.ndarray
    """int64, the 1-based line on which each data row ends (the header is line 1)"""

    def __len__(self) -> int:
        return len(self.line_numbers)

    @property
    def end_line(self) -> int:
        """the line after the last row: where a missing row would have been"""
        return int(self.line_numbers[-1]) + 1 if len(self) else 2


def read_csv_columns(path: str | Path, required: Sequence[str], optional: Sequence[str] = (),
                     allow_other_columns: bool = True) -> CsvColumns:
    """Read ``path``: a header naming at least ``required``, then rows of as many fields.

    :param required: columns the header must name; a missing one is refused.
    :param optional: columns read when the header names them.
    :param allow_other_columns: whether the header may name columns outside ``required`` and
        ``optional`` (they are then ignored); when False an unknown one is refused, so that a
        misspelt optional column is not silently left out.
    Blank lines at the end of the file are ignored; a blank line before a row is refused.
    """
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            # CRLF and old Mac CR-only line endings read as LF
            text = f.read().replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError:
        raise TraceFormatError.not_utf8(path) from None
    expected = _expected_header(required, optional)
    wanted = [*required, *optional]
    if '"' not in text:  # no quoting: one line a row, split by hand
        header_line, _, body = text.partition("\n")
        header = [name.strip() for name in header_line.split(",")] if header_line else []
        _check_header(path, header, expected, required, optional, allow_other_columns)
        columns = _split_regular_rows(body, len(header))
        if columns is not None:
            index = {name: i for i, name in enumerate(header)}
            num_rows = len(columns[0])
            return CsvColumns(path=path, header=header,
                              values={name: columns[index[name]] for name in wanted
                                      if name in index},
                              line_numbers=np.arange(2, num_rows + 2, dtype=np.int64))
        lines = body.split("\n")  # irregular: go row by row to name the first bad one
        rows = [line.split(",") if line else [] for line in lines]
        line_numbers = list(range(2, len(rows) + 2))
    else:
        header, rows, line_numbers = _read_quoted_rows(path, text)
        _check_header(path, header, expected, required, optional, allow_other_columns)
    while rows and not rows[-1]:
        rows.pop()
    num_fields = len(header)
    for i, row in enumerate(rows):
        if len(row) != num_fields:
            if not row:
                raise TraceFormatError(path, line_numbers[i], None,
                                       f"blank line before the row on line {line_numbers[i + 1]}")
            column = header[len(row)] if len(row) < num_fields else str(num_fields + 1)
            raise TraceFormatError(path, line_numbers[i], column,
                                   f"expected {num_fields} fields ({','.join(header)}), "
                                   f"got {len(row)}")
    index = {name: i for i, name in enumerate(header)}
    values = {name: [row[index[name]] for row in rows] for name in wanted if name in index}
    return CsvColumns(path=path, header=header, values=values,
                      line_numbers=np.asarray(line_numbers[:len(rows)], dtype=np.int64))


def _expected_header(required: Sequence[str], optional: Sequence[str]) -> str:
    return ",".join(required) + "".join(f"[,{c}]" for c in optional)


def _split_regular_rows(body: str, num_fields: int) -> list[list[str]] | None:
    """The columns of unquoted rows, when every line up to the trailing newlines has exactly
    ``num_fields`` fields; None otherwise (the caller then finds the first bad line).

    Counts the commas of every line with numpy and splits the whole body at once, which reads
    a million rows several times faster than a list per row.
    """
    body = body.rstrip("\n")
    if not body:
        return [[] for _ in range(num_fields)]
    raw = np.frombuffer(body.encode(), dtype=np.uint8)
    newlines = np.flatnonzero(raw == ord("\n"))
    starts = np.concatenate([[0], newlines + 1])
    ends = np.concatenate([newlines, [len(raw)]])
    commas_before = np.concatenate([[0], np.cumsum(raw == ord(","))])  # in raw[:k]
    if np.any(ends == starts) or np.any(commas_before[ends] - commas_before[starts]
                                        != num_fields - 1):
        return None
    fields = body.replace("\n", ",").split(",")
    return [fields[k::num_fields] for k in range(num_fields)]


def _read_quoted_rows(path: Path, text: str) -> tuple[list[str], list[list[str]], list[int]]:
    """The header (names stripped), the rows and the 1-based line on which each row ends, read
    with the csv module, for files that quote fields (a quoted field may span lines)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [name.strip() for name in next(reader, [])]
        rows, line_numbers = [], []
        for row in reader:
            rows.append(row)
            line_numbers.append(reader.line_num)
    except csv.Error as e:
        raise TraceFormatError(path, reader.line_num, None, f"not valid CSV: {e}") from None
    return header, rows, line_numbers


def _check_header(path: Path, header: list[str], expected: str, required: Sequence[str],
                  optional: Sequence[str], allow_other_columns: bool) -> None:
    if not header:
        raise TraceFormatError(path, 1, None,
                               f"empty file; expected a header with columns {expected}")
    found = ",".join(header)
    for name in required:
        if name not in header:
            raise TraceFormatError(path, 1, name, f"missing from the header {found!r}")
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise TraceFormatError(path, 1, name, f"named twice in the header {found!r}")
        seen.add(name)
        if not allow_other_columns and name not in required and name not in optional:
            raise TraceFormatError(path, 1, name, f"unknown column; expected {expected}")


def parse_counts(table: CsvColumns, column: str) -> np.ndarray:
    """A column of non-negative integers (token counts) as int64; anything else is refused."""
    values = table.values[column]
    joined = "\n".join(values)
    # the usual case, checked in one pass (a quoted value with a line break in it would pass as
    # two lines: the count of lines says it did not)
    if _COUNTS.fullmatch(joined) and joined.count("\n") == len(values) - 1:
        return np.array(list(map(int, values)), dtype=np.int64)
    for i, text in enumerate(values):
        if not _COUNT.fullmatch(text.strip()):
            raise TraceFormatError(table.path, int(table.line_numbers[i]), column,
                                   f"expected a non-negative integer, got {shown(text)}")
    return np.array([int(text) for text in values], dtype=np.int64)  # spaces around digits


def parse_seconds(table: CsvColumns, column: str) -> np.ndarray:
    """A column of finite, non-negative numbers of seconds as float64."""
    values = table.values[column]
    try:
        seconds = np.array(values, dtype=np.float64)
    except ValueError:
        seconds = None
    if seconds is not None and np.all(seconds >= 0) and np.all(seconds <= MAX_ARRIVAL_S) \
            and not any("_" in text for text in values):
        return seconds
    for i, text in enumerate(values):  # find the first bad value
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0) or "_" in text:
            raise TraceFormatError(table.path, int(table.line_numbers[i]), column,
                                   f"expected a non-negative number of seconds, got {shown(text)}")
        if value > MAX_ARRIVAL_S:
            raise TraceFormatError(table.path, int(table.line_numbers[i]), column,
                                   f"{text.strip()} s is past the engine's limit of "
                                   f"{MAX_ARRIVAL_S:g} s")
    raise AssertionError(f"numpy refused column {column} but no single value")


def parse_names(table: CsvColumns, column: str) -> np.ndarray:
    """A column of non-empty names (stripped of surrounding spaces) as a numpy str array."""
    names = [text.strip() for text in table.values[column]]
    for i, name in enumerate(names):
        if not name:
            raise TraceFormatError(table.path, int(table.line_numbers[i]), column,
                                   f"expected a name, got {table.values[column][i]!r}")
    return np.asarray(names, dtype=str)
