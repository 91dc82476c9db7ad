"""``GET /v1/policy`` and ``POST /v1/policy/reload``."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from runtime.api.deps import ReloadAuth, ServicesDep
from runtime.api.schemas import PolicyOut, ReloadRequest
from runtime.decider.decision import MODEL_MISSING
from runtime.decider.guard import GuardedDecider
from runtime.decider.onnx_policy import PolicyLoadError

router = APIRouter(prefix="/v1/policy", tags=["policy"])


def policy_out(decider: GuardedDecider) -> PolicyOut:
    info = decider.describe()
    if info["policy"] is not None:
        # the file name only: the server's folder layout is not the client's business
        path = info["policy"].pop("path")
        info["policy"]["name"] = path.rsplit("/", 1)[-1] if path else None
    return PolicyOut.model_validate(info)


@router.get("", response_model=PolicyOut)
async def get_policy(services: ServicesDep) -> PolicyOut:
    """The loaded policy (version, hash, metadata), or why there is none; the guard's settings and
    the breaker's state."""
    return policy_out(services.decider)


@router.post("/reload", response_model=PolicyOut,
             responses={401: {"description": "missing or wrong bearer token"},
                        403: {"description": "reload is disabled (no token configured)"},
                        404: {"description": "no such file in the policy folder"},
                        400: {"description": "the name resolves outside the policy folder"},
                        422: {"description": "invalid name, or the model was refused; the old "
                                             "policy stays"}})
def reload_policy(body: ReloadRequest, _auth: ReloadAuth, services: ServicesDep) -> PolicyOut:
    """Load ``name`` from the policy folder and swap it in atomically once it is checked and
    warmed; decisions continue on the old policy meanwhile. A refused model leaves the old
    policy in place."""
    # a plain def: loading takes tens of milliseconds, so it runs in the thread pool
    decider, metrics = services.decider, services.metrics
    folder = services.settings.policy_dir.resolve()
    path = (folder / body.name).resolve()
    if path.parent != folder:  # a symlink that leads out of the folder
        raise HTTPException(400, f"{body.name!r} resolves outside the policy folder")
    try:
        decider.reload(path)
    except PolicyLoadError as e:
        metrics.reloads.labels(e.reason).inc()
        kept = decider.policy.policy_version if decider.policy is not None else None
        status = 404 if e.reason == MODEL_MISSING else 422
        raise HTTPException(status, {"reason": e.reason,
                                     "message": e.message.replace(str(folder) + "/", ""),
                                     "kept_policy_version": kept}) from None
    metrics.reloads.labels("ok").inc()
    return policy_out(decider)
