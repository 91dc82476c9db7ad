"""``GET /healthz`` (liveness) and ``GET /readyz`` (readiness)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from runtime.api.deps import ServicesDep
from runtime.api.schemas import HealthOut, ReadyOut
from runtime.decider.decision import CIRCUIT_OPEN

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:
    """The process is up and serving requests."""
    return HealthOut(status="ok")


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut}})
async def readyz(services: ServicesDep, response: Response) -> ReadyOut:
    """Ready means the service answers decisions. With no policy the PID answers, and that
    counts as ready (the PID is the designed fallback) unless BATCHPILOT_REQUIRE_POLICY is set,
    when it is 503 until a policy is loaded. An open circuit is ready: the PID has control on
    purpose."""
    decider = services.decider
    policy = decider.policy
    if policy is None:
        ready = not services.settings.require_policy
        out = ReadyOut(ready=ready, source="pid", policy_version=None,
                       reason=decider.missing_reason)
    elif decider.breaker.state == "open":
        out = ReadyOut(ready=True, source="pid", policy_version=policy.policy_version,
                       reason=CIRCUIT_OPEN)
    else:
        out = ReadyOut(ready=True, source="policy", policy_version=policy.policy_version,
                       reason=None)
    if not out.ready:
        response.status_code = 503
    return out
