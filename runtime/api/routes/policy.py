"""``GET /v1/policy`` and ``POST /v1/policy/reload``."""

from __future__ import annotations

import re

from fastapi import APIRouter, HTTPException

from runtime.api.deps import ReloadAuth, ServicesDep
from runtime.api.schemas import PolicyOut, ReloadRequest
from runtime.api.settings import resolve_in_folder
from runtime.decider.decision import MODEL_MISSING
from runtime.decider.guard import GuardedDecider
from runtime.decider.onnx_policy import PolicyLoadError

router = APIRouter(prefix="/v1/policy", tags=["policy"])

OUTSIDE_FOLDER = "outside policy folder"
"""``batchpilot_reloads_total`` outcome of a name that leads out of the folder (400)"""
_FOLDERS = re.compile(r"(?:/[^/\s'\"]+)+/(?=[^/\s'\"]+)")
"""the folder part of an absolute path in a message"""


def without_folders(message: str | None) -> str | None:
    """``message`` with every absolute path cut to its file name: the server's folder layout is
    not the client's business (``GET /v1/policy`` needs no token)."""
    return _FOLDERS.sub("", message) if message is not None else None


def policy_out(decider: GuardedDecider) -> PolicyOut:
    info = decider.describe()
    if info["policy"] is not None:
        path = info["policy"].pop("path")
        info["policy"]["name"] = path.rsplit("/", 1)[-1] if path else None
    info["last_error"] = without_folders(info["last_error"])
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
                        400: {"description": "the name resolves outside the policy folder, or "
                                             "cannot be resolved (a symlink loop)"},
                        422: {"description": "invalid name, or the model was refused; the old "
                                             "policy stays"}})
def reload_policy(body: ReloadRequest, _auth: ReloadAuth, services: ServicesDep) -> PolicyOut:
    """Load ``name`` from the policy folder and swap it in atomically once it is checked and
    warmed; decisions continue on the old policy meanwhile. A refused model leaves the old
    policy in place."""
    # a plain def: loading takes tens of milliseconds, so it runs in the thread pool
    decider, metrics = services.decider, services.metrics
    try:
        path = resolve_in_folder(services.settings.policy_dir, body.name)
    except ValueError as e:  # a symlink that leads out of the folder, or a symlink loop
        metrics.reloads.labels(OUTSIDE_FOLDER).inc()
        raise HTTPException(400, str(e)) from None
    try:
        decider.reload(path)
    except PolicyLoadError as e:
        metrics.reloads.labels(e.reason).inc()
        kept = decider.policy.policy_version if decider.policy is not None else None
        status = 404 if e.reason == MODEL_MISSING else 422
        raise HTTPException(status, {"reason": e.reason,
                                     "message": without_folders(e.message),
                                     "kept_policy_version": kept}) from None
    metrics.reloads.labels("ok").inc()
    return policy_out(decider)
