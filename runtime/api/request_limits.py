"""Request limits as one pure ASGI middleware (BaseHTTPMiddleware would cost a task per
request): body size, body time, requests in progress, and the bytes large bodies hold.

- A declared ``Content-Length`` over the route's limit is answered 413 at once, without reading
  the body (:class:`BodyLimits`, whose check the protocol makes too, before the request becomes
  a task: :mod:`runtime.api.protocol`); a body without one (chunked) is counted as it streams
  in, and the read that passes the limit raises a 413 into the route, which FastAPI answers.
- A body still incomplete ``body_timeout_s`` after the route first asks for it gets 408 and the
  connection is closed (a client that trickles its body cannot hold a connection and a task for
  ever).
- At most ``max_in_progress`` requests are in progress; the next gets 503. A request counts once
  it has arrived whole (its body too), so connections that send nothing, half a head or a
  trickle of body hold no place that a complete request needs (they are bounded by the
  protocol's connection cap and timeouts, :mod:`runtime.api.protocol`). ``GET /healthz`` is
  never refused: liveness is not load.
- Bodies over :data:`LARGE_BODY_BYTES` hold at most ``max_large_bytes`` in the server at once,
  counted as they arrive and released when their request ends; a large body beyond it gets
  503. ``max_in_progress`` bodies of the largest size would otherwise be a gigabyte.

Every limit here holds whatever server runs the app; the connection-level ones are the
protocol's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LARGE_BODY_BYTES = 64 * 1024
"""a body larger than this counts against the bytes large bodies may hold at once"""
RETRY_AFTER_S = 1
"""the ``Retry-After`` of a 503"""
UNLIMITED_PATHS = frozenset({"/healthz"})


@dataclass(frozen=True)
class BodyLimits:
    """The largest body each path accepts."""

    max_body_bytes: int
    """the largest body accepted"""
    path_limits: Mapping[str, int] = field(default_factory=dict)
    """smaller limits for some paths (a route whose valid bodies are small refuses a large one
    before parsing it)"""

    def limit(self, path: str) -> int:
        return self.path_limits.get(path, self.max_body_bytes)

    def declared(self, path: str, content_length: bytes) -> tuple[int, str] | None:
        """The status and detail that refuse a request to ``path`` declaring
        ``content_length``, or None when it may be read."""
        try:
            declared = int(content_length)
        except ValueError:
            return 400, f"Content-Length {content_length[:40]!r} is not a number"
        limit = self.limit(path)
        if declared > limit:
            return 413, f"request body of {declared} bytes exceeds the limit of {limit} bytes"
        return None


class RequestLimits:
    """:param app: the wrapped app
    :param body_limits: the largest body of each path
    :param body_timeout_s: seconds the whole body may take to arrive
    :param max_in_progress: requests in progress at most (see the module docstring)
    :param max_large_bytes: bytes that bodies over :data:`LARGE_BODY_BYTES` may hold at once
    """

    def __init__(self, app: ASGIApp, body_limits: BodyLimits, body_timeout_s: float = 10.0,
                 max_in_progress: int = 256, max_large_bytes: int = 64 * 1024 * 1024) -> None:
        self.app = app
        self.body_limits = body_limits
        self.body_timeout_s = body_timeout_s
        self.max_in_progress = max_in_progress
        self.max_large_bytes = max_large_bytes
        self.in_progress = 0
        """requests in progress now"""
        self.large_bytes = 0
        """bytes large bodies hold now"""

    def _busy(self) -> str:
        return (f"the server has {self.in_progress} requests in progress, its limit "
                "(BATCHPILOT_MAX_CONCURRENCY); retry shortly")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        limit = self.body_limits.limit(path)
        declared = 0
        chunked = False
        for key, value in scope["headers"]:
            if key == b"content-length":
                refusal = self.body_limits.declared(path, value)
                if refusal is not None:
                    await _respond(send, *refusal)
                    return
                declared = int(value)
            elif key == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
        counted = path not in UNLIMITED_PATHS
        admitted = False
        held = 0
        if not chunked and not declared:  # no body: the request has arrived
            if counted and self.in_progress >= self.max_in_progress:
                await _respond(send, 503, self._busy(), retry=True)
                return
            if counted:
                self.in_progress += 1
                admitted = True
        received = 0
        deadline: float | None = None
        timeout_s = self.body_timeout_s

        async def counted_receive() -> Message:
            nonlocal received, deadline, admitted, held
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {timeout_s:g} s",
                                    headers={"connection": "close"}) from None
            if message["type"] != "http.request":
                return message
            size = len(message.get("body", b""))
            received += size
            if received > limit:
                raise HTTPException(413, f"request body exceeds the limit of {limit} bytes")
            if received > LARGE_BODY_BYTES:
                more = received - held
                if self.large_bytes + more > self.max_large_bytes:
                    raise HTTPException(503, "the server holds as many large request bodies as "
                                        "it may (BATCHPILOT_MAX_BODY_BYTES_IN_PROGRESS); retry "
                                        "shortly", headers={"retry-after": str(RETRY_AFTER_S)})
                self.large_bytes += more
                held += more
            if not message.get("more_body", False) and not admitted and counted:
                if self.in_progress >= self.max_in_progress:
                    raise HTTPException(503, self._busy(),
                                        headers={"retry-after": str(RETRY_AFTER_S)})
                self.in_progress += 1
                admitted = True
            return message

        try:
            await self.app(scope, counted_receive, send)
        finally:
            if admitted:
                self.in_progress -= 1
            self.large_bytes -= held


async def _respond(send: Send, status: int, detail: str, retry: bool = False) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    if retry:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
