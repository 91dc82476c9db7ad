"""What the routes depend on, declared as ``Annotated[..., Depends(...)]``.

The decider, the metrics and the settings come as one :class:`Services` bundle: FastAPI resolves
each dependency per request (~50 us each on the 2-core project machine, as much as a decision),
so the hot routes take one. Dependencies are ``async``: a sync one would be run in the thread
pool, a hop that costs more still.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from runtime.api.batch_worker import BatchWorker
from runtime.api.metrics import ServerMetrics
from runtime.api.refused_files import RefusedFiles
from runtime.api.settings import Settings
from runtime.decider.guard import GuardedDecider


@dataclass(frozen=True)
class Services:
    """The app's long-lived objects (``app.state.services``)."""

    settings: Settings
    decider: GuardedDecider
    metrics: ServerMetrics
    worker: BatchWorker | None = None
    """the batch worker process large batches go to (None: they are answered inline)"""
    refused: RefusedFiles = field(default_factory=RefusedFiles)
    """policy files refused by a reload, answered from memory while they stay unchanged"""


async def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]

_bearer = HTTPBearer(auto_error=False, description="the reload token (BATCHPILOT_RELOAD_TOKEN)")


async def require_reload_token(
        services: ServicesDep,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """403 when no token is configured (reload is disabled), 401 without the right one."""
    token = services.settings.reload_token
    if token is None or not token.get_secret_value():
        raise HTTPException(403, "policy reload is disabled: the server has no reload token "
                                 "(set BATCHPILOT_RELOAD_TOKEN)")
    expected = token.get_secret_value().encode()
    if credentials is None or not hmac.compare_digest(credentials.credentials.encode(), expected):
        raise HTTPException(401, "a valid bearer token is required to reload the policy",
                            headers={"WWW-Authenticate": "Bearer"})


ReloadAuth = Annotated[None, Depends(require_reload_token)]
