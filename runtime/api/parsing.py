"""Observation bodies parsed and validated at a cost bounded by their size, whatever they hold.

FastAPI's own body handling builds every validation error before answering: 4,096 empty rows (a
16 KB body) made 81,920 errors and took 0.36 s of the event loop, and one observation with 380k
unknown keys took 2.1 s. Here:

1. A body that cannot be valid is refused before it is parsed. A valid body holds no string but
   the field names and numbers, so its ``{`` are the observations (plus the batch's envelope),
   its ``:`` are their fields (the required ones, and at most every optional one), plus the
   envelope's one, its ``"`` quote those keys only, and each required field's quoted name occurs
   once per observation (an optional one at most once): byte counts, tens of microseconds
   for 16 KB and about 5 ms for 2 MB, check that. A body that fails them is parsed to name its
   first errors only when it is small (:data:`PARSE_INVALID_BYTES`); a larger one gets one error
   saying what is wrong with it. (So a repeated key, of which a JSON parser would keep the last,
   is refused.)
2. Otherwise the body is parsed once (pydantic-core's JSON parser), the field names of each row
   are checked by set operations, and pydantic validates the values only of rows whose names are
   right, a few rows at a time; the first rows with errors stop it, so a 422 reports at most
   :data:`MAX_ERRORS_SHOWN` errors and costs about as much as one bad row.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from runtime.api.schemas import MAX_BATCH, Observation
from runtime.observation import OBS_DIM, OBSERVATION_NAMES, REQUIRED_NAMES

MAX_ERRORS_SHOWN = 20
"""A 422 lists at most this many validation errors."""
PARSE_INVALID_BYTES = 8 * 1024
"""a body that cannot be valid is parsed, to name its first errors, only up to this size"""
VALIDATE_ROWS = 32
"""rows whose names are right are validated this many at a time (at most 640 errors a chunk)"""
JSON_MEDIA_TYPE = "application/json"

_OBSERVATIONS = TypeAdapter(list[Observation])  # type: ignore[valid-type]
_NAMES = frozenset(OBSERVATION_NAMES)
_REQUIRED = frozenset(REQUIRED_NAMES)
_NUM_REQUIRED = len(REQUIRED_NAMES)
_QUOTED_NAMES = tuple((f'"{name}"'.encode(), name in _REQUIRED) for name in OBSERVATION_NAMES)
_BATCH_KEY = "observations"
_ABSENT = object()


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
            raise RequestValidationError(self.items)


def check_content_type(content_type: str | None) -> None:
    """A body must be declared JSON (``application/json``, parameters allowed); anything else is
    a 422 that names the content type, before the body is parsed."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != JSON_MEDIA_TYPE:
        raise RequestValidationError([{
            "loc": ("header", "content-type"),
            "msg": f"the body must be {JSON_MEDIA_TYPE}, got {media or 'no content type'!r}",
            "type": "content_type"}])


def _refuse_what_cannot_be_valid(body: bytes, envelope: int) -> None:
    """Raise a one-error 422 when ``body`` (with ``envelope`` braces and keys around its
    observations: 1 for a batch, 0 for one observation) cannot be valid and is too large to be
    worth parsing for its first errors.

    A valid body quotes nothing but its keys (the values are numbers), its ``{`` are the
    observations and the envelope, its ``:`` their keys, and each observation holds each required
    field once and each optional one at most once: so each required field's quoted name occurs
    once per observation, an optional one at most that often. Byte counts check all that (about
    5 ms for 2 MB, against 25 ms to parse it)."""
    num_objects = body.count(b"{") - envelope
    num_keys = body.count(b":") - envelope
    problem = None
    if (not num_objects * _NUM_REQUIRED <= num_keys <= num_objects * OBS_DIM
            or not (envelope or num_objects == 1)):
        problem = (f"{max(num_objects, 0)} objects with {max(num_keys, 0)} keys in all, where "
                   f"each observation is an object of {_NUM_REQUIRED} to {OBS_DIM} fields")
    elif body.count(b'"') != 2 * (num_keys + envelope):
        problem = "it quotes more than its keys, where every value is a number"
    else:
        for name, required in _QUOTED_NAMES:
            count = body.count(name)
            if count > num_objects or (required and count != num_objects):
                problem = (f"{name.decode()} occurs {count} times for {num_objects} objects, "
                           "where each observation has each field "
                           f"{'once' if required else 'at most once'}")
                break
    if problem is None or len(body) <= PARSE_INVALID_BYTES:
        return  # maybe valid, or small: parsing it names the first errors
    what = "observations" if envelope else "an observation"
    raise RequestValidationError([{"loc": ("body",), "msg": f"cannot be {what}: {problem}",
                                   "type": "invalid_shape"}])


def _parse(body: bytes) -> Any:
    try:
        return pydantic_core.from_json(body)
    except ValueError as e:
        raise RequestValidationError([{"loc": ("body",), "msg": f"JSON decode error: {e}",
                                       "type": "json_invalid"}]) from None


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


def _validate_rows(rows: list, loc: tuple, errors: _Errors,
                   indexed: bool = True) -> list[Any]:
    """The rows validated (floats, bounds); stops at the first chunk with errors. ``indexed``:
    error locations name the row's index after ``loc`` (a batch), else not (one observation)."""
    out: list[Any] = []  # Observation dicts: field name to float
    for start in range(0, len(rows), VALIDATE_ROWS):
        chunk = rows[start:start + VALIDATE_ROWS]
        good = True
        for i, row in enumerate(chunk):
            good &= _check_names(row, (*loc, start + i) if indexed else loc, errors)
            if errors.full:
                break
        if not good:
            break
        try:
            out.extend(_OBSERVATIONS.validate_python(chunk))
        except ValidationError as e:
            for err in e.errors(include_url=False, include_input=False, include_context=False):
                index, *rest = err["loc"]
                where = (*loc, start + int(index), *rest) if indexed else (*loc, *rest)
                errors.add(where, err["msg"], err["type"])
            break
    errors.raise_if_any()
    return out


def parse_observation(body: bytes) -> Any:
    """One observation from a ``POST /v1/decide`` body; raises ``RequestValidationError``."""
    if not body:
        _missing_body()
    _refuse_what_cannot_be_valid(body, 0)
    return _validate_rows([_parse(body)], (), _Errors(), indexed=False)[0]


def parse_batch(body: bytes) -> list[Any]:
    """The observations of a ``POST /v1/decide/batch`` body; raises ``RequestValidationError``."""
    if not body:
        _missing_body()
    _refuse_what_cannot_be_valid(body, 1)
    value = _parse(body)
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
    return _validate_rows(rows, (_BATCH_KEY,), errors)


def _missing_body() -> Any:
    raise RequestValidationError([{"loc": ("body",), "msg": "Field required",
                                   "type": "missing"}])
