"""The error a trace reader raises for input it refuses."""

from __future__ import annotations

from pathlib import Path

MAX_SHOWN_CHARS = 40
"""a bad value longer than this is cut in messages (a 5,000-digit number is not repeated)"""


def shown(value: object) -> str:
    """``repr(value)``, cut to :data:`MAX_SHOWN_CHARS` characters with its length said."""
    text = repr(value) if not isinstance(value, int) or isinstance(value, bool) else \
        _int_text(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:MAX_SHOWN_CHARS]}... ({len(text)} characters)"


def _int_text(value: int) -> str:
    try:
        return repr(value)
    except ValueError:  # more digits than Python converts to text
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"


class TraceFormatError(ValueError):
    """A trace file that cannot be read as its format says.

    The message names the file, the 1-based line (a CSV header is line 1) and, where one is to
    blame, the column, e.g. ``conv.csv, line 17, column ContextTokens: expected a non-negative
    integer, got 'abc'``. The same facts are attributes, for code that handles the error.
    """

    def __init__(self, path: str | Path, line: int, column: str | None, problem: str) -> None:
        self.path = Path(path)
        """the file, as the reader was given it"""
        self.line = line
        """1-based line number; a CSV header is line 1"""
        self.column = column
        """the column's name (a JSON key for JSON lines), its 1-based position where it has no
        name, or None where the problem is the whole line or file"""
        self.problem = problem
        """what is wrong, without the location"""
        where = f"{self.path.name}, line {line}"
        if column is not None:
            where += f", column {column}"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):
        # rebuilt from its own arguments, so that it crosses a process pool or Ray intact
        return type(self), (self.path, self.line, self.column, self.problem)

    @classmethod
    def not_utf8(cls, path: str | Path) -> TraceFormatError:
        """The error for a file that is not UTF-8 text, naming the line of its first bad byte."""
        data = Path(path).read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            line_start = data.rfind(b"\n", 0, e.start) + 1
            return cls(path, data.count(b"\n", 0, e.start) + 1, None,
                       f"not UTF-8 text: {e.reason} (byte {data[e.start]:#04x} at byte "
                       f"{e.start - line_start + 1} of the line)")
        raise ValueError(f"{path} is valid UTF-8")
