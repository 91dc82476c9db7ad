"""Reading a CSV trace file into named string columns, and turning those into numpy arrays.

Every problem is raised as a :class:`TraceFormatError` naming the file, the line and the column.
The readers of the CSV formats (Azure, BurstGPT, plain) share this; each knows its own columns.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from env.traces.errors import TraceFormatError

_COUNTS = re.compile(r"(?:\d{1,15}\n)*\d{1,15}")
"""one or more non-negative integers of at most 15 digits, a line each (more would be no token
count, and could overflow int64 sums)"""


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
    header, rows, line_numbers = _read_rows(path, _expected_header(required, optional))
    _check_header(path, header, required, optional, allow_other_columns)
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
    values = {name: [row[index[name]] for row in rows]
              for name in (*required, *optional) if name in index}
    return CsvColumns(path=path, header=header, values=values,
                      line_numbers=np.asarray(line_numbers[:len(rows)], dtype=np.int64))


def _expected_header(required: Sequence[str], optional: Sequence[str]) -> str:
    return ",".join(required) + "".join(f"[,{c}]" for c in optional)


def _read_rows(path: Path, expected: str) -> tuple[list[str], list[list[str]], list[int]]:
    """The header (names stripped), the rows, and the 1-based line on which each row ends."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        try:
            header = [name.strip() for name in next(reader, [])]
            if not header:
                raise TraceFormatError(path, 1, None,
                                       f"empty file; expected a header with columns {expected}")
            header_lines = reader.line_num
            rows = list(reader)
            if reader.line_num == header_lines + len(rows):  # one line a row, the usual case
                return header, rows, list(range(header_lines + 1, reader.line_num + 1))
            # A quoted field spans lines: read again, noting where each row ends.
            f.seek(0)
            reader = csv.reader(f)
            next(reader)
            rows, line_numbers = [], []
            for row in reader:
                rows.append(row)
                line_numbers.append(reader.line_num)
            return header, rows, line_numbers
        except csv.Error as e:
            raise TraceFormatError(path, reader.line_num, None, f"not valid CSV: {e}") from None
        except UnicodeDecodeError:
            raise TraceFormatError.not_utf8(path) from None


def _check_header(path: Path, header: list[str], required: Sequence[str],
                  optional: Sequence[str], allow_other_columns: bool) -> None:
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
            raise TraceFormatError(path, 1, name, "unknown column; expected "
                                   + _expected_header(required, optional))


def parse_counts(table: CsvColumns, column: str) -> np.ndarray:
    """A column of non-negative integers (token counts) as int64; anything else is refused."""
    values = table.values[column]
    if _COUNTS.fullmatch("\n".join(values)):  # the usual case, checked in one pass
        return np.array(list(map(int, values)), dtype=np.int64)
    for i, text in enumerate(values):
        if not _COUNTS.fullmatch(text.strip()):
            raise TraceFormatError(table.path, int(table.line_numbers[i]), column,
                                   f"expected a non-negative integer, got {text!r}")
    return np.array([int(text) for text in values], dtype=np.int64)  # spaces around digits


def parse_seconds(table: CsvColumns, column: str) -> np.ndarray:
    """A column of finite, non-negative numbers of seconds as float64."""
    values = table.values[column]
    out = np.empty(len(values), dtype=np.float64)
    for i, text in enumerate(values):
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds >= 0) or "_" in text:
            raise TraceFormatError(table.path, int(table.line_numbers[i]), column,
                                   f"expected a non-negative number of seconds, got {text!r}")
        out[i] = seconds
    return out


def parse_names(table: CsvColumns, column: str) -> np.ndarray:
    """A column of non-empty names (stripped of surrounding spaces) as a numpy str array."""
    names = [text.strip() for text in table.values[column]]
    for i, name in enumerate(names):
        if not name:
            raise TraceFormatError(table.path, int(table.line_numbers[i]), column,
                                   f"expected a name, got {table.values[column][i]!r}")
    return np.asarray(names, dtype=str)
