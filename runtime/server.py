"""The decision service: FastAPI over the guarded decider.

Run it with ``python -m runtime.server``: it listens on ``BATCHPILOT_HOST:BATCHPILOT_PORT``
(127.0.0.1:8000) and loads ``BATCHPILOT_POLICY_DIR/BATCHPILOT_POLICY_FILE``
(``checkpoints/shipped/policy.onnx``), or decides with the PID alone when there is none. Routes,
settings and metrics are described in ``docs/rest.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import TypeAdapter
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from runtime.api.batch_worker import BatchWorker, shared_worker
from runtime.api.deps import Services
from runtime.api.heap import HeapTrimmer, freeze_start_up_objects, return_large_blocks
from runtime.api.metrics import ServerMetrics, watch_loop_lag
from runtime.api.parsing import BodyErrors, errors_body
from runtime.api.protocol import ConnectionLimits, guarded_protocol
from runtime.api.request_limits import BodyLimits, RequestLimits
from runtime.api.routes import decide, health, policy
from runtime.api.routes.policy import MAX_RELOAD_BODY_BYTES
from runtime.api.schemas import BatchRequest, ReloadRequest
from runtime.api.settings import ENV_PREFIX, Settings, SettingsError, load_settings
from runtime.decider.breaker import CircuitBreaker
from runtime.decider.decision import MODEL_MISSING
from runtime.decider.guard import GuardedDecider
from runtime.decider.pid import PidController

log = logging.getLogger("runtime.server")
WORKER_START_S = 60.0
"""how long start-up waits for the batch worker to answer"""


def decider_from_settings(settings: Settings) -> GuardedDecider:
    """The decider the settings describe. Its circuit breaker is off: over REST the observations
    are the clients', and no client's reading may switch the policy off for the others (see
    :mod:`runtime.decider.breaker`)."""
    breaker = CircuitBreaker(trip_after=0)
    static = settings.static_knobs()
    common: dict = {"max_step": settings.max_step, "breaker": breaker,
                    "max_policy_bytes": settings.max_policy_bytes,
                    "pid": PidController(static=static), "static_knobs": static}
    try:
        path = settings.start_policy_path()
    except ValueError as e:
        decider = GuardedDecider(None, **common)
        decider.refuse_start_policy(MODEL_MISSING, str(e))
        log.warning("no policy, deciding with the PID: %s", e)
        return decider
    return GuardedDecider(path, **common)


async def _client_disconnect(request: Request, exc: ClientDisconnect) -> Response:
    """A client that hung up before its body arrived: nobody reads the answer, and it is no
    server error (uvicorn logged a traceback for each, which under a client that does it on
    purpose filled the log)."""
    return Response(status_code=400)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 body (``detail``: a list of ``loc``, ``msg``, ``type``), without echoing the
    input back and cut to the first errors."""
    return JSONResponse(errors_body(list(exc.errors())), status_code=422)


async def _body_errors(request: Request, exc: BodyErrors) -> JSONResponse:
    """The same 422 for the bodies the routes parse themselves (runtime.api.parsing)."""
    return JSONResponse(errors_body(exc.errors), status_code=422)


def _openapi(app: FastAPI) -> dict:
    """FastAPI's OpenAPI document plus the schemas of the bodies that routes validate
    themselves (the batch route parses its body with pydantic-core for speed)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                             routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, kind in (("BatchRequest", BatchRequest), ("ReloadRequest", ReloadRequest)):
            extra = TypeAdapter(kind).json_schema(ref_template="#/components/schemas/{model}")
            components.update(extra.pop("$defs", {}))
            components[name] = extra
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(settings: Settings | None = None, decider: GuardedDecider | None = None,
               worker: BatchWorker | None = None) -> FastAPI:
    """The app.

    :param settings: configuration (read from the environment when None)
    :param decider: the decider to serve (built from ``settings`` when None)
    :param worker: the batch worker (the process's shared one when None and the settings use
        one)
    """
    settings = settings if settings is not None else load_settings()
    decider = decider if decider is not None else decider_from_settings(settings)
    if worker is None and settings.batch_worker:
        worker = shared_worker(settings.batch_worker_nice, settings.batch_worker_small_nice)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if worker is not None:
            # the lanes' sockets are this loop's to read and write: no thread of the server
            # then waits for the GIL beside the loop (runtime.api.batch_worker.BatchWorker)
            worker.attach()
            # the worker takes a second to import what it needs: the server is up once it
            # answers, not at the first large batch
            if not await asyncio.to_thread(worker.wait_ready, WORKER_START_S):
                log.warning("the batch worker did not start within %g s; large batches will "
                            "try again", WORKER_START_S)
        lag = asyncio.create_task(watch_loop_lag(app.state.services.metrics.loop_lag.observe))
        try:
            yield
        finally:
            lag.cancel()
            if worker is not None:
                worker.detach()

    app = FastAPI(title="batchpilot decider",
                  summary="Batching knobs for LLM serving from a learned policy with a PID "
                          "fallback",
                  version="1", lifespan=lifespan)
    app.state.services = Services(settings, decider, ServerMetrics(decider), worker)
    app.include_router(decide.router)
    app.include_router(policy.router)
    app.include_router(health.router)
    # starlette types a handler as taking any Exception; this one is registered for one kind
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _client_disconnect)  # type: ignore[arg-type]
    app.add_exception_handler(BodyErrors, _body_errors)  # type: ignore[arg-type]
    app.add_middleware(RequestLimits, body_limits=body_limits(settings),
                       body_timeout_s=settings.body_timeout_s,
                       max_in_progress=settings.max_concurrency,
                       max_large_bytes=settings.max_body_bytes_in_progress)

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


def body_limits(settings: Settings) -> BodyLimits:
    """The largest body of each route: the middleware's and the protocol's."""
    return BodyLimits(settings.max_body_bytes,
                      {"/v1/decide": settings.max_decide_body_bytes,
                       "/v1/policy/reload": MAX_RELOAD_BODY_BYTES})


def connection_limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(max_header_bytes=settings.max_header_bytes,
                            max_headers=settings.max_headers,
                            header_timeout_s=settings.header_timeout_s,
                            max_connections=settings.max_connections)


def uvicorn_config(settings: Settings, app: FastAPI | None = None):
    """The uvicorn configuration that serves ``app`` (built from ``settings`` when None) with
    the settings' address, parser, header limits, timeouts and connection cap. The limit on
    requests in progress is the app's own (:class:`runtime.api.request_limits.RequestLimits`),
    not uvicorn's, which counted open connections, silent ones included. No WebSocket: the app
    serves none, and an upgrade would leave the guarded protocol for uvicorn's own."""
    import uvicorn

    return uvicorn.Config(app if app is not None else create_app(settings), host=settings.host,
                          port=settings.port, log_level=settings.log_level,
                          access_log=settings.access_log,
                          http=guarded_protocol(settings.http, connection_limits(settings),
                                                body_limits(settings)),
                          h11_max_incomplete_event_size=settings.max_header_bytes,
                          timeout_keep_alive=settings.keep_alive_timeout_s,
                          limit_concurrency=None, ws="none")


SWITCH_INTERVAL_S = 0.001
"""The interpreter's thread switch interval in the server (Python's default is 5 ms): a thread
(a reload's) hands the GIL back to the event loop within 1 ms."""
FILES_PER_SERVER = 64
"""file descriptors the server needs besides its connections (the policy, logs, the worker)"""


def ensure_file_limit(max_connections: int) -> None:
    """Raise the soft limit on open files to what ``max_connections`` needs (up to the hard
    limit); :class:`SettingsError` when even the hard limit is too low: accepting would
    otherwise fail under load, for every client."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    need = max_connections + FILES_PER_SERVER
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < need:
            raise SettingsError(
                f"{ENV_PREFIX}MAX_CONNECTIONS: {max_connections} connections need {need} open "
                f"files, and this process may open at most {target} (ulimit -n): lower it or "
                "raise the limit")


def main() -> None:
    import sys

    import uvicorn

    try:
        settings = load_settings()
        ensure_file_limit(settings.max_connections)
    except SettingsError as e:
        # no traceback, and no value of a secret: the message names the variables
        print(f"batchpilot-serve: refused settings:\n{e}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return_large_blocks()
    HeapTrimmer().start()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = uvicorn_config(settings)
    freeze_start_up_objects()
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
