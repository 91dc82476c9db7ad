"""The decision service: FastAPI over the guarded decider.

Run it with ``python -m runtime.server``: it listens on ``BATCHPILOT_HOST:BATCHPILOT_PORT``
(127.0.0.1:8000) and loads ``BATCHPILOT_POLICY_DIR/BATCHPILOT_POLICY_FILE``
(``checkpoints/shipped/policy.onnx``), or decides with the PID alone when there is none. Routes,
settings and metrics are described in ``docs/rest.md``.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import TypeAdapter
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from runtime.api.body_limit import BodySizeLimit
from runtime.api.deps import Services
from runtime.api.metrics import ServerMetrics
from runtime.api.parsing import MAX_ERRORS_SHOWN
from runtime.api.protocol import header_timeout_protocol
from runtime.api.routes import decide, health, policy
from runtime.api.schemas import BatchRequest
from runtime.api.settings import Settings
from runtime.decider.breaker import CircuitBreaker
from runtime.decider.decision import MODEL_MISSING
from runtime.decider.guard import GuardedDecider

log = logging.getLogger("runtime.server")


def decider_from_settings(settings: Settings) -> GuardedDecider:
    """The decider the settings describe. Its circuit breaker is off: over REST the observations
    are the clients', and no client's reading may switch the policy off for the others (see
    :mod:`runtime.decider.breaker`)."""
    breaker = CircuitBreaker(trip_after=0)
    try:
        path = settings.start_policy_path()
    except ValueError as e:
        decider = GuardedDecider(None, max_step=settings.max_step, breaker=breaker)
        decider.refuse_start_policy(MODEL_MISSING, str(e))
        log.warning("no policy, deciding with the PID: %s", e)
        return decider
    return GuardedDecider(path, max_step=settings.max_step, breaker=breaker)


async def _client_disconnect(request: Request, exc: ClientDisconnect) -> Response:
    """A client that hung up before its body arrived: nobody reads the answer, and it is no
    server error (uvicorn logged a traceback for each, which under a client that does it on
    purpose filled the log)."""
    return Response(status_code=400)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 body (``detail``: a list of ``loc``, ``msg``, ``type``), without echoing the
    input back and cut to the first errors."""
    errors = exc.errors()
    detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
              for e in errors[:MAX_ERRORS_SHOWN]]
    return JSONResponse({"detail": detail, "num_errors": len(detail)}, status_code=422)


def _openapi(app: FastAPI) -> dict:
    """FastAPI's OpenAPI document plus the schemas of the bodies that routes validate
    themselves (the batch route parses its body with pydantic-core for speed)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                             routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        extra = TypeAdapter(BatchRequest).json_schema(
            ref_template="#/components/schemas/{model}")
        components.update(extra.pop("$defs", {}))
        components["BatchRequest"] = extra
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(settings: Settings | None = None,
               decider: GuardedDecider | None = None) -> FastAPI:
    """The app.

    :param settings: configuration (read from the environment when None)
    :param decider: the decider to serve (built from ``settings`` when None)
    """
    settings = settings if settings is not None else Settings()
    decider = decider if decider is not None else decider_from_settings(settings)
    app = FastAPI(title="batchpilot decider",
                  summary="Batching knobs for LLM serving from a learned policy with a PID "
                          "fallback",
                  version="1")
    app.state.services = Services(settings, decider, ServerMetrics(decider))
    app.include_router(decide.router)
    app.include_router(policy.router)
    app.include_router(health.router)
    # starlette types a handler as taking any Exception; this one is registered for one kind
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _client_disconnect)  # type: ignore[arg-type]
    app.add_middleware(BodySizeLimit, max_body_bytes=settings.max_body_bytes,
                       path_limits={"/v1/decide": settings.max_decide_body_bytes},
                       body_timeout_s=settings.body_timeout_s)

    @app.get("/metrics", tags=["health"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def metrics() -> Response:
        """Prometheus text format: decisions by source, latency, fallbacks, reloads, breaker."""
        return Response(generate_latest(app.state.services.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    # replacing the method is FastAPI's documented way to extend the schema
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]

    policy_state = (f"policy {decider.policy.policy_version}" if decider.policy is not None
                    else f"PID alone ({decider.missing_reason})")
    log.info("decider ready: %s", policy_state)
    return app


def uvicorn_config(settings: Settings, app: FastAPI | None = None):
    """The uvicorn configuration that serves ``app`` (built from ``settings`` when None) with
    the settings' address, timeouts and concurrency limit."""
    import uvicorn

    return uvicorn.Config(app if app is not None else create_app(settings), host=settings.host,
                          port=settings.port, log_level=settings.log_level,
                          access_log=settings.access_log,
                          http=header_timeout_protocol(settings.header_timeout_s),
                          timeout_keep_alive=settings.keep_alive_timeout_s,
                          limit_concurrency=settings.max_concurrency)


SWITCH_INTERVAL_S = 0.001
"""The interpreter's thread switch interval in the server (Python's default is 5 ms): a thread
parsing a large body hands the GIL back to the event loop within 1 ms, so single decisions wait
at most that long behind it."""


def main() -> None:
    import sys

    import uvicorn

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.Server(uvicorn_config(settings)).run()


if __name__ == "__main__":
    main()
