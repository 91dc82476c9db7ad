"""``POST /v1/decide`` and ``POST /v1/decide/batch``: knobs for named observations."""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from operator import itemgetter

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import TypeAdapter

from runtime.api.deps import ServicesDep
from runtime.api.metrics import ServerMetrics
from runtime.api.parsing import JSON_MEDIA_TYPE, check_content_type, parse_batch, parse_observation
from runtime.api.schemas import BatchResponse, DecisionOut
from runtime.decider.decision import Decision
from runtime.decider.guard import GuardedDecider
from runtime.knobs import Knobs
from runtime.observation import (
    OBS_DIM,
    OBSERVATION_NAMES,
    field_defaults,
    vector_from_fields,
    vectors_from_rows,
)

router = APIRouter(prefix="/v1", tags=["decide"])

INLINE_BODY_BYTES = 64 * 1024
"""Batch bodies up to this size (~110 observations) are parsed, validated and decided on the
event loop; larger ones on :data:`LARGE_BODIES`, so that the loop gets the GIL back every switch
interval and single decisions are not held up for a whole 4096-row batch (~100 ms)."""
LARGE_BODIES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchpilot-large-body")
"""One thread for the large bodies, taken one at a time: clients that send many large bodies
(valid or not) queue behind each other instead of taking every core and a malloc arena per
thread of the shared pool (the server's memory grew 18 MiB a minute under 2 MB bodies with it)."""

_BATCH_RESPONSE = TypeAdapter(BatchResponse)
_DECISION = TypeAdapter(DecisionOut)
_row = itemgetter(*OBSERVATION_NAMES)


@functools.lru_cache(maxsize=4)
def _defaults(static_knobs: Knobs) -> dict[str, float]:
    """:func:`runtime.observation.field_defaults`, built once per static knobs (a decider's are
    fixed; read only)."""
    return field_defaults(static_knobs)


def decision_out(d: Decision) -> DecisionOut:
    k = d.knobs
    return {"knobs": {"batch_window_ms": k.batch_window_ms,
                      "prefill_chunk_tokens": k.prefill_chunk_tokens,
                      "kv_cache_ratio": k.kv_cache_ratio, "batch_share": k.batch_share,
                      "admission_slack": k.admission_slack},
            "source": d.source, "reason": d.reason, "spec_version": d.spec_version,
            "policy_version": d.policy_version}


def _body_schema(name: str) -> dict:
    """The OpenAPI request body of a route that parses its body itself (runtime.api.parsing)."""
    return {"requestBody": {"required": True, "content": {JSON_MEDIA_TYPE: {
        "schema": {"$ref": f"#/components/schemas/{name}"}}}}}


@router.post("/decide", response_model=DecisionOut, openapi_extra=_body_schema("Observation"))
async def decide(request: Request, services: ServicesDep) -> Response:
    """Knobs for one observation."""
    # async: a decision takes microseconds, less than a hop to the thread pool would; the body
    # (at most BATCHPILOT_MAX_DECIDE_BODY_BYTES) is parsed with a bounded cost, and the answer is
    # serialised here, skipping FastAPI's re-validation of what we just built
    check_content_type(request.headers.get("content-type"))
    observation = parse_observation(await request.body())
    t0 = time.perf_counter()
    decider = services.decider
    d = decider.decide(vector_from_fields(observation, decider.static_knobs), client=True)
    services.metrics.record("decide", d, time.perf_counter() - t0)
    return Response(_DECISION.dump_json(decision_out(d)), media_type=JSON_MEDIA_TYPE)


def _decide_body(body: bytes, decider: GuardedDecider, metrics: ServerMetrics) -> bytes:
    observations = parse_batch(body)
    t0 = time.perf_counter()
    if observations:
        # the rows in OBSERVATION_NAMES order, whatever order the client sent the fields in, the
        # optional fields it left out filled in
        defaults = _defaults(decider.static_knobs)
        rows = np.array([_row(o) if len(o) == OBS_DIM else _row({**defaults, **o})
                         for o in observations], dtype=np.float64)
        decisions = decider.decide_batch(vectors_from_rows(rows))
    else:
        decisions = []
    metrics.record_batch(decisions, time.perf_counter() - t0)
    return _BATCH_RESPONSE.dump_json({"decisions": [decision_out(d) for d in decisions]})


@router.post("/decide/batch", response_model=BatchResponse,
             openapi_extra=_body_schema("BatchRequest"))
async def decide_batch(request: Request, services: ServicesDep) -> Response:
    """Knobs for up to 4096 observations, answered in order, with the policy run once on the
    stacked batch."""
    # The body is parsed by pydantic-core and validated with a bounded cost rather than by
    # FastAPI (runtime.api.parsing); the OpenAPI document shows the BatchRequest schema (see
    # runtime.server).
    check_content_type(request.headers.get("content-type"))
    body = await request.body()
    if len(body) <= INLINE_BODY_BYTES:
        out = _decide_body(body, services.decider, services.metrics)
    else:
        out = await asyncio.get_running_loop().run_in_executor(
            LARGE_BODIES, _decide_body, body, services.decider, services.metrics)
    return Response(out, media_type=JSON_MEDIA_TYPE)
