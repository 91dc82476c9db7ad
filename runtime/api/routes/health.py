"""``GET /healthz`` (liveness) and ``GET /readyz`` (readiness)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from runtime.api.deps import ServicesDep
from runtime.api.schemas import HealthOut, ReadyOut
from runtime.decider.decision import CIRCUIT_OPEN, OUT_OF_DISTRIBUTION

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:
    """The process is up and serving requests."""
    return HealthOut(status="ok")


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ReadyOut}})
async def readyz(services: ServicesDep, response: Response) -> ReadyOut:
    """Ready means the service answers decisions. With no policy the PID answers, and that
    counts as ready (the PID is the designed fallback) unless BATCHPILOT_REQUIRE_POLICY is set,
    when it is 503 until the policy actually decides. ``source`` is who actually decided most
    of the last minute's decisions (a loaded policy whose answers are all refused is not
    deciding), with the share of fallbacks over that minute; ``reason`` the commonest fallback
    reason (``out of distribution`` while the observations have left the policy's training
    distribution)."""
    decider = services.decider
    policy = decider.policy
    recent = decider.recent.summary()
    source, reason = recent["source"], recent["top_reason"]
    if source is None:  # no decision yet: who would decide an ordinary observation now
        if policy is None:
            source, reason = "pid", decider.missing_reason
        elif not decider.breaker.is_closed():
            source, reason = "pid", CIRCUIT_OPEN
        elif decider.ood_guard and policy.ood_guard is not None and policy.ood_guard.tripped:
            source, reason = "pid", OUT_OF_DISTRIBUTION
        else:
            source, reason = "policy", None
    elif source == "policy":
        reason = None
    ready = source == "policy" or not services.settings.require_policy
    if not ready:
        response.status_code = 503
    return ReadyOut(ready=ready, source=source,
                    policy_version=policy.policy_version if policy is not None else None,
                    reason=reason, fallback_share_1m=recent["fallback_share"],
                    decisions_1m=recent["decisions"])
