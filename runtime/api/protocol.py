"""uvicorn's HTTP/1.1 protocols with the connection-level limits a public server needs.

uvicorn leaves several holes that a careless or hostile client found (probed on loopback):

- **Headers without bounds.** httptools accepts a header of any size, and joins a value that
  arrives in many reads by repeated concatenation: a 96 MB header took 10 s of the event loop
  and blocked every other client. Here a request line and headers are bounded in bytes
  (``max_header_bytes``) and in lines (``max_headers``); beyond either the client gets 431 and
  the connection is closed. The bytes fed to the parser while a head is incomplete are counted
  as they arrive, so the parser never holds more than the limit plus one read of the socket,
  and the lines the parser completes are counted exactly.
- **Connections that send nothing.** A connection whose head never arrives is closed
  ``header_timeout_s`` after it opened (or after its previous answer). Such connections do not
  count against the limit on requests in progress (that limit is kept by
  :class:`runtime.api.request_limits.RequestLimits`, which counts requests once they have
  arrived), and open connections are capped at ``max_connections``: a new connection beyond
  the cap closes the connection that has been without a request in progress the longest
  (silent, sending half a head, trickling a body, or an idle keep-alive), so silent connections
  cannot keep anyone out.
- **Pipelining.** A malformed request after complete ones used to be answered with one 400
  that discarded the answers to the requests before it; they are now sent first, then the 400
  (or 431), then the connection is closed.
- **Bodies declared over their limit.** A ``Content-Length`` over the path's limit
  (:class:`runtime.api.request_limits.BodyLimits`, which the app's middleware checks too) is
  answered 413 as its head completes, and the connection is closed: no ASGI task, no read of
  the body. Through the middleware the same refusal cost a task per request, and the reads of
  the body that arrived before the answer went out.

Two parsers are offered, with the same limits: ``httptools`` (the default: llhttp, in C, about
60 us a request less than h11 here) and ``h11`` (pure Python). With h11 the byte limit is h11's
own bound on an incomplete event, the line count is checked on each parsed head, and the rest
is the same code. :func:`guarded_protocol` builds the class uvicorn instantiates per connection;
each class holds the registry of its server's connections.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

import h11
import httptools
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from runtime.api.request_limits import BodyLimits

HTTP_IMPLEMENTATIONS = ("httptools", "h11")


@dataclass(frozen=True)
class ConnectionLimits:
    """The per-connection limits (see the module docstring)."""

    max_header_bytes: int = 16 * 1024
    """request line and headers, in bytes, at most"""
    max_headers: int = 100
    """header lines at most"""
    header_timeout_s: float = 10.0
    """seconds a connection's head may take to arrive"""
    max_connections: int = 1024
    """open connections at most"""

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_headers", "header_timeout_s", "max_connections"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")


@dataclass
class ConnectionRegistry:
    """The open connections of one server, and those without a request in progress in the
    order they became so (the first is the one to close when a new connection needs room)."""

    open: set = field(default_factory=set)
    idle: dict = field(default_factory=dict)
    """connections without a request in progress -> None, oldest first"""
    evicted: int = 0
    """connections closed to make room for a new one"""


def _response(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


BAD_REQUEST = (400, "Bad Request", "invalid HTTP request")


class _Refused(Exception):
    """Raised from a parser callback to stop httptools at a head it refuses."""


class _Guard:
    """What both protocols share: the head timer, the connection registry, the deferred
    refusal. Used as a mixin before uvicorn's protocol class; the subclasses call these from
    uvicorn's hooks."""

    limits: ConnectionLimits
    registry: ConnectionRegistry
    body_limits: BodyLimits | None = None
    """the bodies' limits, checked on a declared length as the head completes (None: left to
    the app)"""
    # provided by uvicorn's protocol classes
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    root_path: str

    def _guard_start(self) -> None:
        self._header_timer: asyncio.TimerHandle | None = None
        self._refusal: bytes | None = None
        self._arm_header_timer()
        registry = self.registry
        registry.open.add(self)
        registry.idle[self] = None
        while len(registry.open) > self.limits.max_connections:
            victim = next((c for c in registry.idle if c is not self), None)
            registry.evicted += 1
            if victim is None:  # every other connection has a request in progress: refuse
                registry.open.discard(self)
                registry.idle.pop(self, None)
                self._refusal = _response(
                    503, "Service Unavailable",
                    f"the server has {len(registry.open)} connections with requests in "
                    "progress, its limit (BATCHPILOT_MAX_CONNECTIONS); retry shortly")
                self._send_refusal()
                break
            registry.open.discard(victim)
            registry.idle.pop(victim, None)
            victim.transport.close()

    def _guard_end(self) -> None:
        self._disarm_header_timer()
        self.registry.open.discard(self)
        self.registry.idle.pop(self, None)

    def _busy(self) -> None:
        """A complete request is in progress: not to be closed for room."""
        self.registry.idle.pop(self, None)

    def _idle(self) -> None:
        """Nothing in progress (again): the newest candidate to close for room."""
        registry = self.registry
        if self in registry.open:
            registry.idle.pop(self, None)
            registry.idle[self] = None

    # -------------------------------------------------------------------- the head timer
    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout_s,
                                                      self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    # -------------------------------------------------------------------- refusals
    def _send_refusal(self) -> None:
        self._disarm_header_timer()
        if self._refusal is not None and not self.transport.is_closing():
            self.transport.write(self._refusal)
            self.transport.close()

    def _body_refusal(self, raw_path: bytes,
                      headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, str, str] | None:
        """The refusal of a head whose declared body its path does not accept (``raw_path``
        as uvicorn's protocol takes it from the target; ``headers`` with lower-case names)."""
        if self.body_limits is None:
            return None
        for name, value in headers:
            if name == b"content-length":
                path = raw_path.decode("ascii")
                if "%" in path:
                    path = urllib.parse.unquote(path)
                refusal = self.body_limits.declared(self.root_path + path, value)
                if refusal is not None:
                    status, detail = refusal
                    return status, HTTPStatus(status).phrase, detail
        return None

    def _head_too_large_detail(self, lines: int, size: int) -> str:
        limits = self.limits
        if lines > limits.max_headers:
            return (f"the request has more than {limits.max_headers} header lines "
                    "(BATCHPILOT_MAX_HEADERS)")
        return (f"the request line and headers exceed {limits.max_header_bytes} bytes "
                f"(BATCHPILOT_MAX_HEADER_BYTES; {size} bytes so far)")


class GuardedHttpToolsProtocol(_Guard, HttpToolsProtocol):
    """httptools' protocol with the limits (set ``limits`` and ``registry`` on a subclass:
    :func:`guarded_protocol`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head = True
        """no head in progress is complete: the bytes fed count towards the limit"""
        self._head_bytes = 0
        """bytes fed to the parser since the last message ended"""
        self._head_lines = 0
        self._head_size = 0
        """the current head's request target and header lines, as the parser completed them"""
        self._stopped: tuple[int, str, str] | None = None
        """the refusal a parser callback stopped the parser for"""
        self._guard_start()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard_end()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None or self.parser is None:
            return  # refused: the rest of what the client sends is not read
        self._unset_keepalive_if_required()
        if self.cycle is None or self.cycle.response_complete:
            # bytes after an answer (even the empty lines llhttp skips) start the next head's
            # time: they cancelled the keep-alive timer
            self._arm_header_timer()
        limit = self.limits.max_header_bytes
        while data:
            if self._in_head:
                room = limit - self._head_bytes
                if room <= 0:
                    self._refuse(431, "Request Header Fields Too Large",
                                 self._head_too_large_detail(0, self._head_bytes))
                    return
                piece = data if len(data) <= room else data[:room]
                self._head_bytes += len(piece)
            else:
                piece = data
            data = data[len(piece):]
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError:
                self._refuse(*(self._stopped or BAD_REQUEST))
                return

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        """Answer ``status`` and close, once the complete requests before this one have their
        answers (pipelining)."""
        self._refusal = _response(status, reason, detail)
        self._disarm_header_timer()
        self.flow.pause_reading()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.more_body:
            # the request in progress will never get the rest of its body
            cycle.disconnected = True
            cycle.message_event.set()
            self.pipeline.clear()
            self._send_refusal()
        elif cycle is None or (cycle.response_complete and not self.pipeline):
            self._send_refusal()

    # parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_lines = 0
        self._head_size = 0
        self._in_head = True
        self._arm_header_timer()

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        if self._head_size > self.limits.max_header_bytes:
            self._stopped = (431, "Request Header Fields Too Large",
                             self._head_too_large_detail(0, self._head_size))
            raise _Refused
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_lines += 1
        self._head_size += len(name) + len(value) + 4  # ": " and CRLF
        if (self._head_lines > self.limits.max_headers
                or self._head_size > self.limits.max_header_bytes):
            self._stopped = (431, "Request Header Fields Too Large",
                             self._head_too_large_detail(self._head_lines, self._head_size))
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        self._in_head = False
        self._stopped = self._body_refusal(httptools.parse_url(self.url).path, self.headers)
        if self._stopped is not None:
            raise _Refused
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.cycle is not None and not self.cycle.response_complete:
            self._busy()
        self._in_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # the next request's head gets the keep-alive timeout to start, then its own
        self._disarm_header_timer()
        if self.pipeline or (self.cycle is not None and not self.cycle.response_complete):
            return
        if self._refusal is not None:
            self._unset_keepalive_if_required()
            self._send_refusal()
        else:
            self._idle()


class GuardedH11Protocol(_Guard, H11Protocol):
    """h11's protocol with the limits. h11 bounds an incomplete head itself (uvicorn passes
    ``h11_max_incomplete_event_size``, see :func:`runtime.server.uvicorn_config`) and answers
    pipelined requests one after the other; this adds the line count, the head timer and the
    connection registry."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._bad: tuple[int, str, str] | None = None
        self._in_progress = False
        next_event = self.conn.next_event
        limits = self.limits

        def guarded_next_event() -> Any:
            try:
                event = next_event()
            except h11.RemoteProtocolError as e:
                if e.error_status_hint == 431:
                    self._bad = (431, "Request Header Fields Too Large",
                                 self._head_too_large_detail(0, limits.max_header_bytes + 1))
                raise
            kind = type(event)
            if isinstance(event, h11.Request):
                self._disarm_header_timer()
                lines = len(event.headers)
                # h11 bounds a head that is still incomplete; one that came whole in one read
                # is measured here (request target and header lines, as httptools' are)
                size = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
                if lines > limits.max_headers or size > limits.max_header_bytes:
                    self._bad = (431, "Request Header Fields Too Large",
                                 self._head_too_large_detail(lines, size))
                    raise h11.RemoteProtocolError("head over the limits", error_status_hint=431)
                self._bad = self._body_refusal(event.target.partition(b"?")[0], event.headers)
                if self._bad is not None:
                    raise h11.RemoteProtocolError("body refused", error_status_hint=self._bad[0])
            elif kind is h11.EndOfMessage and self.conn.our_state is not h11.DONE:
                self._busy()  # (DONE: answered before its body ended, e.g. a 413)
            return event

        self.conn.next_event = guarded_next_event  # type: ignore[method-assign]
        self._guard_start()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard_end()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        if self.cycle is None or self.cycle.response_complete:
            self._arm_header_timer()  # the next request's head starts
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        status, reason, detail = self._bad or BAD_REQUEST
        self._refusal = _response(status, reason, detail)
        self._send_refusal()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm_header_timer()
        self._idle()


def guarded_protocol(implementation: Literal["httptools", "h11"], limits: ConnectionLimits,
                     body_limits: BodyLimits | None = None) -> type[asyncio.Protocol]:
    """The protocol class for one server: ``implementation``'s, with ``limits``,
    ``body_limits`` and a registry of its own (uvicorn instantiates the class once per
    connection)."""
    base: type[_Guard]
    if implementation == "httptools":
        base = GuardedHttpToolsProtocol
    elif implementation == "h11":
        base = GuardedH11Protocol
    else:
        raise ValueError(f"the HTTP implementation is one of {HTTP_IMPLEMENTATIONS}, got "
                         f"{implementation!r}")
    return type(base.__name__, (base,), {"limits": limits, "body_limits": body_limits,
                                         "registry": ConnectionRegistry()})
