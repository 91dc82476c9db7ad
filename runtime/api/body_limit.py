"""Refuse request bodies over a size limit with 413 before they are read into memory, and bodies
that do not arrive in time with 408."""

from __future__ import annotations

import asyncio
import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodySizeLimit:
    """Pure ASGI middleware (BaseHTTPMiddleware would cost a task per request).

    A declared ``Content-Length`` over the limit is answered at once, without reading the body; a
    body without one (chunked) is counted as it streams in, and the read that passes the limit
    raises a 413 ``HTTPException`` into the route, which FastAPI answers. A body still incomplete
    ``body_timeout_s`` after the route first asks for it gets a 408 and the connection is closed
    (a client that trickles its body cannot hold a connection and a task forever).

    :param app: the wrapped app
    :param max_body_bytes: the largest body accepted
    :param path_limits: smaller limits for some paths (a route whose valid bodies are small
        refuses a large one before parsing it)
    :param body_timeout_s: seconds the whole body may take to arrive
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int,
                 path_limits: dict[str, int] | None = None,
                 body_timeout_s: float = 10.0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = dict(path_limits or {})
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_body_bytes)
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _respond(send, 400, f"Content-Length {value[:40]!r} is not a number")
                    return
                if declared > limit:
                    await _respond(send, 413, f"request body of {declared} bytes exceeds the "
                                   f"limit of {limit} bytes")
                    return
                break
        received = 0
        deadline: float | None = None
        timeout_s = self.body_timeout_s

        async def counted_receive() -> Message:
            nonlocal received, deadline
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {timeout_s:g} s",
                                    headers={"connection": "close"}) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"request body exceeds the limit of {limit} bytes")
            return message

        await self.app(scope, counted_receive, send)


async def _respond(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
