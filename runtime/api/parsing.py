"""Observation bodies parsed and validated at a cost bounded by their size, whatever they hold.

FastAPI's own body handling builds every validation error before answering: 4,096 empty rows (a
16 KB body) made 81,920 errors and took 0.36 s of the event loop, and one observation with 380k
unknown keys took 2.1 s. Here:

1. A body that cannot be valid is refused before it is parsed. A valid body holds no string but
   the field names and numbers, so its ``{`` are the observations (plus the batch's envelope),
   its ``:`` their fields (from the required ones to all of them) plus the envelope's one, its
   ``"`` quote those keys only, its ``,`` separate the fields and the observations, and a batch
   has one ``[``: five byte counts check that. A body that fails them is parsed to name its
   first errors only when it is small (:data:`PARSE_INVALID_BYTES`, and still refused when
   parsing names none, as a body with a key given twice would be); a larger one gets one error
   saying what is wrong with it.
2. Otherwise the body is parsed once, by orjson (twice as fast as pydantic-core's parser on a
   256-row batch, and stricter: no ``NaN``, no number past a double's range); a body orjson
   refuses is parsed again by pydantic-core, whose errors (and whose ``NaN``, refused later as
   not finite) are what a client sees, so that the two parsers answer alike. A field given twice
   is refused at every size: both parsers keep the last value, so the keys kept are counted
   against the ``:`` of the body.
3. A batch's rows go into one float64 array in one pass (the field names of each row checked as
   a set, the optional fields filled in), and the values are checked on the array: numbers only
   (no string, boolean or null: a body whose quotes are all its keys' holds no string, and its
   letters tell a boolean), finite, within :func:`runtime.api.bounds.field_bounds`. A
   body that passes is never shown to pydantic. Any row that fails, and only then, sends the
   rows from its chunk on to pydantic's validation (:data:`VALIDATE_ROWS` at a time, stopping at
   the first chunk with errors), so a 422 says exactly what the schema says, lists at most
   :data:`MAX_ERRORS_SHOWN` errors, and costs about as much as one bad chunk.

The errors are raised as :class:`BodyErrors` (FastAPI's 422 shape, without the input echoed
back): this module does not import FastAPI, so the batch worker process can use it.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections import Counter
from collections.abc import Generator
from operator import itemgetter
from typing import Any

import numpy as np
import orjson
import pydantic_core

from runtime.api.bounds import MAX_BATCH, field_bounds
from runtime.observation import OBS_DIM, OBSERVATION_FIELDS, OBSERVATION_NAMES, REQUIRED_NAMES

MAX_ERRORS_SHOWN = 20
"""A 422 lists at most this many validation errors."""
PARSE_INVALID_BYTES = 8 * 1024
"""a body that cannot be valid is parsed, to name its first errors, only up to this size"""
VALIDATE_ROWS = 32
"""rows sent to pydantic are validated this many at a time (at most 640 errors a chunk)"""
COUNT_WITH_NUMPY_BYTES = 16 * 1024
"""larger bodies have their bytes counted with numpy (five times faster than ``bytes.count``
on 256 KB)"""
JSON_MEDIA_TYPE = "application/json"
Body = bytes | bytearray
"""a request body: ``bytes`` as the server reads it, a ``bytearray`` as the batch worker
receives a large one"""


@functools.cache
def _observations_adapter() -> Any:
    """pydantic's validator of a list of observations, which names a body's errors. Built at the
    first body that needs it: the batch worker's lanes import this module, and pydantic with the
    request schemas would add about 14 MB to each for bodies they may never see."""
    from pydantic import TypeAdapter

    from runtime.api.schemas import Observation

    return TypeAdapter(list[Observation])  # type: ignore[valid-type]


_NAMES = frozenset(OBSERVATION_NAMES)
_REQUIRED = frozenset(REQUIRED_NAMES)
_NUM_REQUIRED = len(REQUIRED_NAMES)
_BATCH_KEY = "observations"
_ABSENT = object()
_row = itemgetter(*OBSERVATION_NAMES)
_LOW = np.array([field_bounds(f).get("ge", -np.inf) for f in OBSERVATION_FIELDS])
_HIGH = np.array([field_bounds(f).get("le", np.inf) for f in OBSERVATION_FIELDS])
_COUNTED = b'{:",['
"""the bytes step 1 counts"""
_BOOL_LETTERS = b"ul"
"""a ``true`` holds a ``u``, a ``false`` an ``l``: a valid body holds these letters only in its
keys, so counting them against the keys' finds a boolean value"""
_NAME_LETTERS = {name: (name.count("u"), name.count("l")) for name in OBSERVATION_NAMES}
_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:')


class BodyErrors(ValueError):
    """A refused body: ``errors`` in FastAPI's shape (``loc``, ``msg``, ``type``), at most
    :data:`MAX_ERRORS_SHOWN`."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(errors)} errors, first: {errors[0] if errors else None}")
        self.errors = errors


def errors_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The 422 answer's body."""
    detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
              for e in errors[:MAX_ERRORS_SHOWN]]
    return {"detail": detail, "num_errors": len(detail)}


class _Errors:
    """Collects errors up to the cap; ``full`` once it is reached."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    @property
    def full(self) -> bool:
        return len(self.items) >= MAX_ERRORS_SHOWN

    def add(self, loc: tuple, msg: str, kind: str) -> None:
        if not self.full:
            self.items.append({"loc": ("body", *loc), "msg": msg, "type": kind})

    def raise_if_any(self) -> None:
        if self.items:
            raise BodyErrors(self.items)


def _one_error(loc: tuple, msg: str, kind: str) -> BodyErrors:
    return BodyErrors([{"loc": ("body", *loc), "msg": msg, "type": kind}])


def check_content_type(content_type: str | None) -> None:
    """A body must be declared JSON (``application/json``, parameters allowed); anything else is
    a 422 that names the content type, before the body is parsed."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != JSON_MEDIA_TYPE:
        raise BodyErrors([{
            "loc": ("header", "content-type"),
            "msg": f"the body must be {JSON_MEDIA_TYPE}, got {media or 'no content type'!r}",
            "type": "content_type"}])


# ------------------------------------------------------------------------ step 1: byte counts
def _byte_counts(body: Body, which: bytes) -> dict[int, int]:
    """How often each byte of ``which`` occurs in ``body``."""
    if len(body) <= COUNT_WITH_NUMPY_BYTES:
        return {b: body.count(bytes((b,))) for b in which}
    array = np.frombuffer(body, dtype=np.uint8)
    return {b: int(np.count_nonzero(array == b)) for b in which}


def _shape_problem(counts: dict[int, int], envelope: int) -> str | None:
    """What makes a body with these byte counts invalid (None: the counts are those of a valid
    body). ``envelope``: 1 for a batch (``{"observations": [...]}``), 0 for one observation."""
    num_objects = counts[ord("{")] - envelope
    num_keys = counts[ord(":")] - envelope
    if (not num_objects * _NUM_REQUIRED <= num_keys <= num_objects * OBS_DIM
            or not (envelope or num_objects == 1)):
        return (f"{max(num_objects, 0)} objects with {max(num_keys, 0)} keys in all, where each "
                f"observation is an object of {_NUM_REQUIRED} to {OBS_DIM} fields")
    if counts[ord('"')] != 2 * (num_keys + envelope):
        return "it quotes more than its keys, where every value is a number"
    if counts[ord("[")] != envelope:
        return ("it holds a list other than the batch's observations" if envelope else
                "it holds a list, where every value is a number")
    commas = counts[ord(",")]
    if commas != max(num_keys - 1, 0):
        return (f"it has {commas} commas for {num_keys} keys, where the fields and the "
                f"observations are separated by one each ({max(num_keys - 1, 0)})")
    return None


def _refuse_what_cannot_be_valid(body: Body, envelope: int) -> tuple[dict[int, int], str | None]:
    """The byte counts of ``body`` (see :func:`_shape_problem`), and what makes it invalid when
    it is small enough to be parsed for its first errors (None when its counts are a valid
    body's). Raises a one-error 422 when it cannot be valid and is larger than that."""
    counts = _byte_counts(body, _COUNTED + (_BOOL_LETTERS if envelope else b""))
    problem = _shape_problem(counts, envelope)
    if problem is not None and len(body) > PARSE_INVALID_BYTES:
        raise _shape_error(problem, envelope)
    return counts, problem


def _quotes_are_keys(counts: dict[int, int]) -> bool:
    """Whether a body has two quotes for each ``:``, as one that quotes its keys only does. A
    string value that keeps the count must hold a ``:`` itself, and no ``float()`` parses that:
    a row whose values :func:`_rows_fast` can put into its array holds no string."""
    return counts[ord('"')] == 2 * counts[ord(":")]


def _shape_error(problem: str, envelope: int) -> BodyErrors:
    what = "observations" if envelope else "an observation"
    return _one_error((), f"cannot be {what}: {problem}", "invalid_shape")


def _parse(body: Body) -> Any:
    """``body`` parsed (see the module docstring, step 2: orjson, then pydantic-core for what
    orjson refuses); a one-error 422 naming pydantic-core's reason when neither parses it."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return pydantic_core.from_json(body)
    except ValueError as e:
        raise _one_error((), f"JSON decode error: {e}", "json_invalid") from None


# ------------------------------------------------------------------------ repeated keys
def _repeated_key(text: Body) -> str | None:
    """The first key given twice in one object's text, if any."""
    seen: Counter[bytes] = Counter(m.group(1) for m in _KEY.finditer(text))
    for key, n in seen.items():
        if n > 1:
            return key.decode(errors="replace")
    return None


def _repeated_key_error(loc: tuple, name: str | None) -> BodyErrors:
    where = (*loc, name) if name is not None else loc
    return _one_error(where, "Duplicate key: each field may be given once in an observation",
                      "duplicate_key")


def _find_repeated_row(body: Body, rows: list) -> tuple[int, str | None]:
    """The batch row that lost a key to the parser (its keys given in the body outnumber those
    parsed), found by counting the ``:`` between the ``}`` that end the rows; (-1, None) when
    the body's shape does not allow it (then the error names no row)."""
    b = np.frombuffer(body, dtype=np.uint8)
    ends = np.flatnonzero(b == ord("}"))[:-1]  # the last one closes the envelope
    if len(ends) != len(rows):
        return -1, None
    colons = np.flatnonzero(b == ord(":"))[1:]  # the first one is the envelope's
    per_row = np.diff(np.searchsorted(colons, ends), prepend=0)
    for i, (n, row) in enumerate(zip(per_row.tolist(), rows)):
        if isinstance(row, dict) and n != len(row):
            start = int(ends[i - 1]) + 1 if i else 0
            return i, _repeated_key(body[start:int(ends[i]) + 1])
    return -1, None


# ------------------------------------------------------------------------ step 3: validation
def _check_names(row: Any, loc: tuple, errors: _Errors) -> bool:
    """Whether ``row`` is an object with the observation's required fields and no unknown ones;
    the errors if not."""
    if not isinstance(row, dict):
        errors.add(loc, "Input should be a valid dictionary", "dict_type")
        return False
    keys = row.keys()
    if keys == _NAMES or (_REQUIRED <= keys and keys <= _NAMES):
        return True
    for name in REQUIRED_NAMES:
        if name not in row:
            errors.add((*loc, name), "Field required", "missing")
    for name in row:
        if errors.full:
            break
        if name not in _NAMES:
            errors.add((*loc, name), "Extra inputs are not permitted", "extra_forbidden")
    return False


def _validate_rows(rows: list, loc: tuple, errors: _Errors, indexed: bool = True,
                   offset: int = 0) -> list[Any]:
    """The rows validated by pydantic (floats, bounds); stops at the first chunk with errors.
    ``indexed``: error locations name the row's index (plus ``offset``) after ``loc`` (a
    batch), else not (one observation)."""
    out: list[Any] = []  # Observation dicts: field name to float
    for start in range(0, len(rows), VALIDATE_ROWS):
        chunk = rows[start:start + VALIDATE_ROWS]
        good = True
        for i, row in enumerate(chunk):
            good &= _check_names(row, (*loc, offset + start + i) if indexed else loc, errors)
            if errors.full:
                break
        if not good:
            break
        adapter = _observations_adapter()
        from pydantic import ValidationError
        try:
            out.extend(adapter.validate_python(chunk))
        except ValidationError as e:
            for err in e.errors(include_url=False, include_input=False, include_context=False):
                index, *rest = err["loc"]
                where = ((*loc, offset + start + int(index), *rest) if indexed
                         else (*loc, *rest))
                errors.add(where, err["msg"], err["type"])
            break
    errors.raise_if_any()
    return out


def _is_number(v: Any) -> bool:
    return (type(v) is float or type(v) is int) and -2**63 <= v < 2**63


def _rows_fast(rows: list, defaults: dict[str, float],
               numbers_only: bool = False) -> tuple[np.ndarray, int, int] | None:
    """The rows as raw values ``[n, OBS_DIM]`` when every row is an object of known fields with
    the required ones, and every value a finite number within its bounds (then also the count of
    the letters ``u`` and ``l`` in their keys, to check against the body's: a boolean value
    passes the array's checks as 1 or 0); None otherwise (:func:`_rows_array` names what).
    ``numbers_only``: the body's quotes are its keys' (:func:`_quotes_are_keys`), so the values
    go straight into the array (``np.fromiter``: twice as fast as building it from the rows'
    tuples, but it would take a string of digits for a number)."""
    n = len(rows)
    try:
        full = sum(map(len, rows)) == n * OBS_DIM
        tuples = list(map(_row, rows)) if full else None
    except (TypeError, KeyError):  # a row that is not an object, or lacks a field
        tuples = None
    if tuples is not None:  # every row holds every field, and no other (n * OBS_DIM keys)
        u, ll = _FULL_LETTERS
        letters_u, letters_l = n * u, n * ll
    else:
        tuples = []
        letters_u = letters_l = 0
        for row in rows:
            if type(row) is not dict:
                return None
            keys = row.keys()
            if len(row) == OBS_DIM and keys == _NAMES:
                tuples.append(_row(row))
            elif _REQUIRED <= keys and keys <= _NAMES:
                tuples.append(_row({**defaults, **row}))
            else:
                return None
            for name in keys:
                u, ll = _NAME_LETTERS[name]
                letters_u += u
                letters_l += ll
    if n == 0:
        return np.empty((0, OBS_DIM)), 0, 0
    if numbers_only:
        try:  # a null, or an integer past a double's range, refuses
            x = np.fromiter(itertools.chain.from_iterable(tuples), np.float64,
                            n * OBS_DIM).reshape(n, OBS_DIM)
        except (OverflowError, TypeError, ValueError):
            return None
    else:
        try:
            x = np.array(tuples)
        except (OverflowError, ValueError):
            return None
        if x.dtype.kind not in "fi" or x.shape != (n, OBS_DIM):
            return None
        x = x.astype(np.float64, copy=False)
    if not (np.isfinite(x) & (x >= _LOW) & (x <= _HIGH)).all():
        return None
    return x, letters_u, letters_l


def _letters_agree(counts: dict[int, int], letters_u: int, letters_l: int) -> bool:
    return (counts.get(ord("u"), letters_u + _ENVELOPE_LETTERS[0])
            == letters_u + _ENVELOPE_LETTERS[0]
            and counts.get(ord("l"), letters_l + _ENVELOPE_LETTERS[1])
            == letters_l + _ENVELOPE_LETTERS[1])


def _rows_array(rows: list, defaults: dict[str, float], counts: dict[int, int],
                numbers_only: bool) -> np.ndarray:
    """The rows as raw values ``[n, OBS_DIM]`` in :data:`OBSERVATION_NAMES` order, the optional
    fields filled from ``defaults``; :class:`BodyErrors` as pydantic's validation would raise
    them (see the module docstring, step 3). ``numbers_only``: see :func:`_rows_fast`."""
    fast = _rows_fast(rows, defaults, numbers_only)
    if fast is not None and _letters_agree(counts, fast[1], fast[2]):
        return fast[0]
    return _rows_by_pydantic(rows, defaults)


def _rows_by_pydantic(rows: list, defaults: dict[str, float]) -> np.ndarray:
    """What pydantic says of rows the array checks refused: the errors of the first rows it
    refuses, from the chunk of the first row the checks found wrong (pydantic stops at the first
    chunk with errors), or, when it finds nothing wrong, the rows it validated."""
    n = len(rows)
    first_bad = 0
    for i, row in enumerate(rows):
        if type(row) is not dict or not (_REQUIRED <= row.keys() <= _NAMES):
            first_bad = i
            break
        values = row.values()
        if not all(map(_is_number, values)) or any(type(v) is bool for v in values):
            first_bad = i
            break
        x = np.array([_row({**defaults, **row})], dtype=np.float64)
        if not (np.isfinite(x) & (x >= _LOW) & (x <= _HIGH)).all():
            first_bad = i
            break
    start = first_bad - first_bad % VALIDATE_ROWS
    valid = _validate_rows(rows[start:], (_BATCH_KEY,), _Errors(), offset=start)
    if start:  # pydantic found nothing wrong where the array checks did: it has the last word
        valid = _validate_rows(rows, (_BATCH_KEY,), _Errors())
    return np.array([_row(o) if len(o) == OBS_DIM else _row({**defaults, **o}) for o in valid],
                    dtype=np.float64).reshape(n, OBS_DIM)


_FULL_LETTERS = (sum(u for u, _ in _NAME_LETTERS.values()),
                 sum(ll for _, ll in _NAME_LETTERS.values()))
_ENVELOPE_LETTERS = (_BATCH_KEY.count("u"), _BATCH_KEY.count("l"))


# ------------------------------------------------------------------------ the two bodies
def parse_observation(body: bytes) -> Any:
    """One observation from a ``POST /v1/decide`` body; raises :class:`BodyErrors`."""
    if not body:
        _missing_body()
    counts, problem = _refuse_what_cannot_be_valid(body, 0)
    value = _parse(body)
    observation = _validate_rows([value], (), _Errors(), indexed=False)[0]
    if len(value) != counts[ord(":")]:  # the parser kept one of a key given twice
        raise _repeated_key_error((), _repeated_key(body))
    if problem is not None:  # its counts are not a valid body's, though parsing named no error
        raise _shape_error(problem, 0)
    return observation


SLICE_BYTES = 256 * 1024
"""a valid batch body over this size is parsed this much at a time (about 256 rows), so that
the batch worker can take turns between clients' batches between slices"""
SLICE_ROWS = 256
"""rows put into the array at a time, in the same stages"""
_SPACE = b" \t\r\n"


def _row_slices(body: Body, counts: dict[int, int]) -> list[tuple[int, int]] | None:
    """Where the rows of a batch body whose byte counts are a valid body's are cut into JSON
    lists of about :data:`SLICE_BYTES` each (:func:`_slice` makes one), at the ``}`` that end its
    rows; None when the body's envelope is not plainly ``{"observations": [...]}`` or its ``}``
    are not one a row (then it is parsed whole). A cut inside a key would leave a slice with an
    odd number of quotes, which does not parse: slices that all parse hold exactly the body's
    rows."""
    start, end = body.find(b"["), body.rfind(b"]")
    if (start < 0 or body[:start].translate(None, _SPACE) != b'{"' + _BATCH_KEY.encode() + b'":'
            or body[end + 1:].translate(None, _SPACE) != b"}"):
        return None
    ends = (np.flatnonzero(np.frombuffer(body, dtype=np.uint8)[start:end] == ord("}"))
            + start).tolist()
    if len(ends) != counts[ord("{")] - 1:
        return None
    spans = []
    a = start + 1
    last = ends[-1] if ends else start
    while a <= last:
        k = bisect.bisect_left(ends, a + SLICE_BYTES)
        b = ends[min(k, len(ends) - 1)]
        spans.append((a, b + 1))
        comma = body.find(b",", b + 1, end)
        a = comma + 1 if comma >= 0 else end
    return spans


def _slice(body: Body, span: tuple[int, int]) -> bytes:
    """One slice of :func:`_row_slices`, a JSON list of rows (made when it is parsed, so that a
    body's slices are not all held at once beside it)."""
    return b"[" + body[span[0]:span[1]] + b"]"


def _sliced_rows(body: Body, spans: list[tuple[int, int]]) -> list:
    """Every row of slices that have each parsed once already."""
    return [row for span in spans for row in orjson.loads(_slice(body, span))]


def batch_rows_stages(body: Body, defaults: dict[str, float]
                      ) -> Generator[None, None, np.ndarray]:
    """:func:`parse_batch` in stages, yielding between them: a large valid body is parsed
    :data:`SLICE_BYTES` at a time and put into the array :data:`SLICE_ROWS` at a time as it is
    parsed (each stage a few milliseconds; a slice's rows are dropped once they are in the
    array, so a 4 MB body's parsed rows, about 10 MB, are never all held at once); anything that
    is not plainly valid is parsed whole for its errors, with the same answer."""
    if not body:
        _missing_body()
    counts, problem = _refuse_what_cannot_be_valid(body, 1)
    spans = (_row_slices(body, counts) if problem is None and len(body) > SLICE_BYTES
             else None)
    rows: list | None = None
    x: np.ndarray | None = None
    if spans is not None:
        yield
        num_rows = num_keys = letters_u = letters_l = 0
        pending: list = []  # rows parsed and not yet in the array
        parts: list[np.ndarray] | None = []  # None once a row is not plainly valid
        for span in spans:
            try:
                got = orjson.loads(_slice(body, span))
            except orjson.JSONDecodeError:
                parts = pending = None  # type: ignore[assignment]
                break
            num_rows += len(got)
            num_keys += sum(map(len, got))
            yield
            if parts is None or num_rows > MAX_BATCH:
                continue  # only counting now
            pending.extend(got)
            # the array is cut where it was when every row was parsed first: SLICE_ROWS rows
            # at a time, once the batch has more than that
            while len(pending) > SLICE_ROWS or (parts and len(pending) == SLICE_ROWS):
                fast = _rows_fast(pending[:SLICE_ROWS], defaults, numbers_only=True)
                if fast is None:
                    parts = None
                    break
                del pending[:SLICE_ROWS]
                parts.append(fast[0])
                letters_u += fast[1]
                letters_l += fast[2]
                yield
        if pending is None:  # a slice did not parse
            rows = None
        elif num_rows > MAX_BATCH:
            raise _one_error((_BATCH_KEY,), f"List should have at most {MAX_BATCH} items after "
                             f"validation, not {num_rows}", "too_long")
        elif parts is not None and not parts:  # no more than SLICE_ROWS rows: all in `pending`
            rows = pending
        else:
            if parts is not None and pending:
                fast = _rows_fast(pending, defaults, numbers_only=True)
                if fast is None:
                    parts = None
                else:
                    parts.append(fast[0])
                    letters_u += fast[1]
                    letters_l += fast[2]
            if parts is not None and _letters_agree(counts, letters_u, letters_l):
                x = np.concatenate(parts)
                if 1 + num_keys != counts[ord(":")]:
                    rows = _sliced_rows(body, spans)
            else:  # a row that is not plainly valid: every row again, for its errors
                rows = _sliced_rows(body, spans)
                x = _rows_by_pydantic(rows, defaults)
    if x is None:
        if rows is None:
            rows = _envelope_rows(_parse(body))
        x = _rows_array(rows, defaults, counts, numbers_only=_quotes_are_keys(counts))
    if rows is not None and 1 + sum(map(len, rows)) != counts[ord(":")]:
        # every value is a number: the parser kept one of a key given twice
        i, name = _find_repeated_row(body, rows)
        raise _repeated_key_error((_BATCH_KEY, i) if i >= 0 else (_BATCH_KEY,), name)
    if problem is not None:
        raise _shape_error(problem, 1)
    return x


def _envelope_rows(value: Any) -> list:
    """The observations of a parsed batch body; the envelope's errors (not an object, a missing
    or extra key, not a list, too long) raised."""
    errors = _Errors()
    if not isinstance(value, dict):
        errors.add((), "Input should be a valid dictionary", "dict_type")
        errors.raise_if_any()
    rows = value.get(_BATCH_KEY, _ABSENT)
    if rows is _ABSENT:
        errors.add((_BATCH_KEY,), "Field required", "missing")
    for name in value:
        if name != _BATCH_KEY:
            errors.add((name,), "Extra inputs are not permitted", "extra_forbidden")
            if errors.full:
                break
    if isinstance(rows, list):
        if len(rows) > MAX_BATCH:
            errors.add((_BATCH_KEY,), f"List should have at most {MAX_BATCH} items after "
                       f"validation, not {len(rows)}", "too_long")
    elif rows is not _ABSENT:
        errors.add((_BATCH_KEY,), "Input should be a valid list", "list_type")
    errors.raise_if_any()
    assert isinstance(rows, list)  # every other case raised above
    return rows


def parse_batch(body: Body, defaults: dict[str, float]) -> np.ndarray:
    """The raw rows ``[n, OBS_DIM]`` of a ``POST /v1/decide/batch`` body, in
    :data:`OBSERVATION_NAMES` order, the optional fields a row leaves out filled from
    ``defaults`` (:func:`runtime.observation.field_defaults`); raises :class:`BodyErrors`."""
    stages = batch_rows_stages(body, defaults)
    while True:
        try:
            next(stages)
        except StopIteration as done:
            return done.value


def _missing_body() -> Any:
    raise _one_error((), "Field required", "missing")
