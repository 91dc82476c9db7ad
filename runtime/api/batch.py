"""The batch route's work, from a request body to the answer's bytes, vectorised.

One pass parses the body into one array (:func:`runtime.api.parsing.parse_batch`), the decider
answers the stacked rows with arrays (:meth:`GuardedDecider.decide_batch_columns`), and the
answer is written from the arrays (:func:`decisions_json`): no pydantic validation, no
:class:`Decision` and no dictionary per row where the policy decided. The answer is
byte-for-byte what pydantic would serialise from the decisions (the tests compare them).

:func:`answer_batch` runs on the event loop for small bodies and in the batch worker process
(:mod:`runtime.api.lane`) for the others; it imports no FastAPI, so the worker stays
light. What the decider learnt from the batch (who decided, lending-guard hits, errors) comes
back as :class:`BatchStats`, which the server applies to its own decider and metrics.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Generator
from typing import NamedTuple

import pydantic_core

from runtime.api.parsing import Body, BodyErrors, batch_rows_stages, errors_body
from runtime.decider.decision import Source
from runtime.decider.guard import BatchDecisions, GuardedDecider
from runtime.knobs import KNOB_NAMES, Knobs
from runtime.observation import SPEC_VERSION, field_defaults, vectors_from_rows

_to_json = pydantic_core.to_json


class BatchStats(NamedTuple):
    """What one batch did to the decider's state, to apply where the decider lives."""

    tally: dict[tuple[Source, str | None], int]
    """decisions by (source, reason)"""
    seconds: float
    """from the validated rows to the decisions"""
    lend_guard_hits: int = 0
    errors: tuple[str, ...] = ()
    """new ``last_error`` messages, oldest first"""


class BatchAnswer(NamedTuple):
    status: int
    """200, or 422 for a refused body"""
    body: bytes | bytearray
    """the answer, JSON (a ``bytearray`` as the batch worker's answers arrive)"""
    stats: BatchStats | None
    """None when the body was refused"""


@functools.lru_cache(maxsize=4)
def defaults_for(static_knobs: Knobs) -> dict[str, float]:
    """:func:`runtime.observation.field_defaults`, built once per static knobs (a decider's are
    fixed; read only)."""
    return field_defaults(static_knobs)


_HEAD = b'{"knobs":{"%s":' % KNOB_NAMES[0].encode()
_SEPS = tuple(b',"%s":' % name.encode() for name in KNOB_NAMES[1:])


@functools.lru_cache(maxsize=64)
def _tail(source: str, reason: str | None, policy_version: str | None) -> bytes:
    """What follows a decision's knobs: ``},"source":...}``, in ``DecisionOut``'s field order."""
    rest = _to_json({"source": source, "reason": reason, "spec_version": SPEC_VERSION,
                     "policy_version": policy_version})
    return b"}," + rest[1:]


def _tokens(values: list) -> list[bytes]:
    """``values`` as JSON numbers, one ``bytes`` each, as pydantic writes them."""
    return _to_json(values)[1:-1].split(b",")


def _rows_json(b: BatchDecisions) -> bytes:
    """The decisions of a batch as JSON objects separated by commas, written from its arrays:
    each knob column becomes JSON numbers in one call, and the pieces of every row are laid out
    in one list that one ``join`` turns into the text."""
    n = len(b.sources)
    if n == 0:
        return b""
    k = b.knobs
    columns = [_tokens(k[:, 0].tolist()), _tokens(k[:, 1].astype("int64").tolist()),
               *(_tokens(k[:, j].tolist()) for j in range(2, k.shape[1]))]
    version = b.policy_version
    if not b.fallbacks:
        tails = [_tail("policy", None, version)] * n
    else:
        tails = [_tail(s, r, version) for s, r in zip(b.sources, b.reasons)]
    width = 2 * len(columns) + 1
    pieces: list[bytes] = [b""] * (width * n)
    pieces[0::width] = [b"," + _HEAD] * n
    pieces[0] = _HEAD
    pieces[1::width] = columns[0]
    for j, sep in enumerate(_SEPS, start=1):
        pieces[2 * j::width] = [sep] * n
        pieces[2 * j + 1::width] = columns[j]
    pieces[width - 1::width] = tails
    return b"".join(pieces)


def decisions_json(b: BatchDecisions) -> bytes:
    """``{"decisions": [...]}`` for a batch (see :func:`_rows_json`)."""
    return b'{"decisions":[' + _rows_json(b) + b"]}"


DECIDE_ROWS = 1024
"""rows decided, and answered, at a time in the stages of a large batch"""


def batch_stages(body: Body, decider: GuardedDecider,
                 circuit_open: bool | None = None) -> Generator[None, None, BatchAnswer]:
    """:func:`answer_batch` in stages of a few milliseconds each (the slices of the parse, then
    :data:`DECIDE_ROWS` rows decided, then answered, at a time), yielding between them: the
    batch worker takes turns between clients' batches at each stage."""
    try:
        rows = yield from batch_rows_stages(body, defaults_for(decider.static_knobs))
    except BodyErrors as e:
        return BatchAnswer(422, _to_json(errors_body(e.errors)), None)
    yield
    vectors = vectors_from_rows(rows)
    seconds = 0.0
    hits, error = decider.lend_guard_hits, decider.last_error_at
    parts = []
    for start in range(0, max(len(vectors), 1), DECIDE_ROWS):
        t0 = time.perf_counter()
        parts.append(decider.decide_batch_columns(vectors[start:start + DECIDE_ROWS],
                                                  circuit_open=circuit_open))
        seconds += time.perf_counter() - t0
        yield
    errors = ((decider.last_error,) if decider.last_error_at != error
              and decider.last_error is not None else ())
    tally: dict[tuple[Source, str | None], int] = {}
    for part in parts:
        for key, count in part.tally.items():
            tally[key] = tally.get(key, 0) + count
    stats = BatchStats(tally, seconds, decider.lend_guard_hits - hits, errors)
    texts = []
    for part in parts:
        texts.append(_rows_json(part))
        yield
    return BatchAnswer(200, b'{"decisions":[' + b",".join(t for t in texts if t) + b"]}",
                       stats)


def answer_batch(body: Body, decider: GuardedDecider,
                 circuit_open: bool | None = None) -> BatchAnswer:
    """The answer to a ``POST /v1/decide/batch`` body: 200 with the decisions, or 422 with the
    first errors. ``circuit_open``: the breaker's state where the decider is a copy (the worker
    process), None to read the decider's own."""
    stages = batch_stages(body, decider, circuit_open)
    while True:
        try:
            next(stages)
        except StopIteration as done:
            return done.value
