"""uvicorn's HTTP protocol with a header timeout.

uvicorn times out idle keep-alive connections, but not a connection whose request line and
headers never finish: a client that opens a connection and sends nothing, or part of a header,
held it (and a slot of the concurrency limit) for ever. This protocol closes such a connection
``header_timeout_s`` after it opened, or after the previous response on a keep-alive connection.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """httptools' protocol, closing connections whose headers do not arrive in time (set
    ``header_timeout_s`` on a subclass: :func:`header_timeout_protocol`)."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s,
                                                      self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # the next request's headers get the keep-alive timeout to start, then their own
        self._disarm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)


def header_timeout_protocol(header_timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class with this header timeout (uvicorn instantiates the class itself)."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be > 0 seconds, got {header_timeout_s}")
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,),
                {"header_timeout_s": header_timeout_s})
