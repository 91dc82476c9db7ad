"""``POST /v1/decide`` and ``POST /v1/decide/batch``: knobs for named observations."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import TypeAdapter

from runtime.api.batch import answer_batch
from runtime.api.batch_worker import WorkerUnavailable
from runtime.api.deps import ServicesDep
from runtime.api.parsing import JSON_MEDIA_TYPE, check_content_type, parse_observation
from runtime.api.request_limits import RETRY_AFTER_S
from runtime.api.schemas import BatchResponse, DecisionOut
from runtime.decider.decision import Decision
from runtime.observation import vector_from_fields

router = APIRouter(prefix="/v1", tags=["decide"])

INLINE_BODY_BYTES = 64 * 1024
"""Batch bodies up to this size (65 to 85 observations) are answered on the event loop, in a
bounded ~0.4 ms (a hop to the worker and back waits for a CPU twice, which under clients that
kept the loop and their own CPU busy made a 64-row batch's p99 three times its own); larger
ones by a batch worker process (:mod:`runtime.api.batch_worker`), so that no client's large
batches hold the loop (and the GIL) that every other client's answers need."""

_DECISION = TypeAdapter(DecisionOut)


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


@router.post("/decide/batch", response_model=BatchResponse,
             openapi_extra=_body_schema("BatchRequest"))
async def decide_batch(request: Request, services: ServicesDep) -> Response:
    """Knobs for up to 4096 observations, answered in order, with the policy run once on the
    stacked batch."""
    # The body is parsed into one array and validated on it rather than by FastAPI
    # (runtime.api.parsing); the OpenAPI document shows the BatchRequest schema (see
    # runtime.server).
    check_content_type(request.headers.get("content-type"))
    pieces = [piece async for piece in request.stream() if piece]
    size = sum(map(len, pieces))
    decider, worker = services.decider, services.worker
    if size <= INLINE_BODY_BYTES or worker is None:
        answer = answer_batch(b"".join(pieces), decider)
    else:  # handed over in the pieces it arrived in: never joined on the loop
        client = request.client
        future = worker.submit(decider, f"{client.host}:{client.port}" if client else "",
                               pieces, not decider.breaker.is_closed())
        try:
            answer = await asyncio.wrap_future(future)
        except WorkerUnavailable as e:
            raise HTTPException(503, str(e), headers={"retry-after": str(RETRY_AFTER_S)}) from None
        if answer.stats is not None:  # the worker's copy decided: count it here
            s = answer.stats
            decider.absorb_batch(s.tally, s.lend_guard_hits, s.errors)
    if answer.stats is not None:
        services.metrics.record_tally(answer.stats.tally, answer.stats.seconds)
    body = answer.body
    return Response(memoryview(body) if isinstance(body, bytearray) else body,  # not copied
                    status_code=answer.status, media_type=JSON_MEDIA_TYPE)
