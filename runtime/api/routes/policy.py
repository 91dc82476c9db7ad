"""``GET /v1/policy`` and ``POST /v1/policy/reload``."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from runtime.api.batch_worker import WorkerUnavailable
from runtime.api.deps import ReloadAuth, ServicesDep
from runtime.api.parsing import MAX_ERRORS_SHOWN
from runtime.api.refused_files import fingerprint
from runtime.api.schemas import PolicyOut, ReloadRequest
from runtime.api.settings import resolve_in_folder, without_folder
from runtime.decider.decision import MODEL_MISSING
from runtime.decider.guard import GuardedDecider
from runtime.decider.onnx_policy import PolicyLoadError

router = APIRouter(prefix="/v1/policy", tags=["policy"])

OUTSIDE_FOLDER = "outside policy folder"
"""``batchpilot_reloads_total`` outcome of a name that leads out of the folder (400)"""
INVALID_REQUEST = "invalid request"
"""``batchpilot_reloads_total`` outcome of a body that is not ``{"name": <a policy file name>}``
(422)"""
MAX_RELOAD_BODY_BYTES = 1024
"""a reload body is ``{"name": ...}`` with a name of at most 206 characters: larger bodies get
413 before they are read"""
UNREAD_REFUSAL_DELAY_S = 0.1
"""how late a reload refused without reading a file is answered (a body that is not
``{"name": ...}``, a name that leads out of the folder, an unchanged file refused before): a
wait, not work, during which the event loop serves the other clients. Answered at once, a token
holder's refused reloads came back in a millisecond and were sent again as fast (an unchanged
refused file: 17 times as many reloads as while each was read, and good single decisions' p99
2.0-2.75x their p99 alone, against 1.2-1.7x); nothing needs such a refusal sooner. Requests
without the token are answered at once: each wait holds a place among the requests in progress,
which a client without the token must not be able to fill."""
_FOLDERS = re.compile(r"(?:/[^/\s'\"]+)+/(?=[^/\s'\"]+)")
"""the folder part of an absolute path in a message"""


def without_folders(message: str | None) -> str | None:
    """``message`` with every absolute path cut to its file name: the server's folder layout is
    not the client's business (``GET /v1/policy`` needs no token). The decider's messages name
    files by their names already; this catches any other path."""
    return _FOLDERS.sub("", message) if message is not None else None


def policy_out(decider: GuardedDecider, folder: Path | None = None) -> PolicyOut:
    info = decider.describe()
    if info["policy"] is not None:
        path = info["policy"].pop("path")
        info["policy"]["name"] = path.rsplit("/", 1)[-1] if path else None
    error = info["last_error"]
    if error is not None and folder is not None:
        error = without_folder(error, folder)
    info["last_error"] = without_folders(error)
    return PolicyOut.model_validate(info)


@router.get("", response_model=PolicyOut)
async def get_policy(services: ServicesDep) -> PolicyOut:
    """The loaded policy (version, hash, metadata), or why there is none; the guard's settings and
    the breaker's state."""
    return policy_out(services.decider, services.settings.policy_dir)


def _refused(services, outcome: str, message: str) -> None:
    """Count a refused reload in the metric and in the decider (``num_failed_reloads``,
    ``last_error``): every refusal, whatever its status, the same way."""
    services.metrics.reloads.labels(outcome).inc()
    services.decider.refuse_reload(message)


async def _late(error: Exception) -> Exception:
    """``error``, once :data:`UNREAD_REFUSAL_DELAY_S` has passed (raise what it returns)."""
    await asyncio.sleep(UNREAD_REFUSAL_DELAY_S)
    return error


async def _checked_in_worker(services, request: Request, path: Path) -> None:
    """Have the batch worker, where the server has one, load the file first: a file it refuses
    is refused without being read in this process (raises :class:`PolicyLoadError`, counted
    as :meth:`GuardedDecider.reload` counts one). A worker that cannot answer checks nothing:
    the reload then reads the file here, as it would without a worker."""
    worker = services.worker
    if worker is None:
        return
    client = request.client
    future = worker.check_policy(f"reload:{client.host}:{client.port}" if client else "reload",
                                 str(path), services.decider.max_policy_bytes)
    try:
        answer = await asyncio.wrap_future(future)
    except WorkerUnavailable:
        return
    if answer.status == 422:
        refusal = json.loads(answer.body)
        error = PolicyLoadError(refusal["reason"], refusal["message"], path)
        services.decider.refuse_reload(str(error))
        raise error


@router.post("/reload", response_model=PolicyOut,
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/ReloadRequest"}}}}},
             responses={401: {"description": "missing or wrong bearer token"},
                        403: {"description": "reload is disabled (no token configured)"},
                        404: {"description": "no such file in the policy folder"},
                        400: {"description": "the name resolves outside the policy folder, or "
                                             "cannot be resolved (a symlink loop)"},
                        413: {"description": "a body over 1 KB"},
                        422: {"description": "invalid name, or the model was refused; the old "
                                             "policy stays"}})
async def reload_policy(request: Request, _auth: ReloadAuth, services: ServicesDep) -> PolicyOut:
    """Load ``name`` from the policy folder and swap it in atomically once it is checked and
    warmed; decisions continue on the old policy meanwhile. A refused model leaves the old
    policy in place."""
    # The token is checked first (a dependency reading headers only), then the body, at most
    # MAX_RELOAD_BODY_BYTES (the size limit answers a larger one before it is read): a client
    # without the token never has its body parsed.
    try:
        body = ReloadRequest.model_validate_json(await request.body())
    except ValidationError as e:
        errors = [{"loc": ("body", *err["loc"]), "msg": err["msg"], "type": err["type"]}
                  for err in e.errors(include_url=False, include_input=False,
                                      include_context=False)[:MAX_ERRORS_SHOWN]]
        first = errors[0]
        _refused(services, INVALID_REQUEST,
                 f"reload refused: {'.'.join(map(str, first['loc']))}: {first['msg']}")
        raise await _late(RequestValidationError(errors)) from None
    folder = services.settings.policy_dir
    decider, metrics = services.decider, services.metrics
    try:
        path = resolve_in_folder(folder, body.name)
    except ValueError as e:  # a symlink that leads out of the folder, or a symlink loop
        _refused(services, OUTSIDE_FOLDER, f"reload refused: {e}")
        raise await _late(HTTPException(400, str(e))) from None
    key = fingerprint(path)
    try:
        known = services.refused.refusal(key, path)
        if known is not None:  # refused before and unchanged since: refused again, unread
            decider.refuse_reload(str(known))
            raise await _late(known)
        await _checked_in_worker(services, request, path)
        # loading takes tens of milliseconds: in the thread pool, off the event loop
        await run_in_threadpool(decider.reload, path)
    except PolicyLoadError as e:  # counted by the decider
        services.refused.remember(key, e)
        metrics.reloads.labels(e.reason).inc()
        kept = decider.policy.policy_version if decider.policy is not None else None
        status = 404 if e.reason == MODEL_MISSING else 422
        raise HTTPException(status, {"reason": e.reason,
                                     "message": without_folders(without_folder(e.message,
                                                                               folder)),
                                     "kept_policy_version": kept}) from None
    metrics.reloads.labels("ok").inc()
    return policy_out(decider, folder)
