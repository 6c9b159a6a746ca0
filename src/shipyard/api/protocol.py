"""uvicorn's HTTP protocol with the read timeouts it lacks.

uvicorn times out an idle keep-alive connection, but nothing else a client sends: a connection
that opens and says nothing, or sends its headers a byte every two seconds, or stops halfway
through a body, stays open for ever (slowloris), each holding a socket and a parser. This
protocol gives a request ``HEADERS_S`` from its first byte (or from the connection's opening)
to its last header, and a body ``BODY_IDLE_S`` of silence at most between two pieces; past
either it answers 408 when nothing was answered yet and closes the connection. A body the
server itself is not reading (flow control paused it) is never the client's fault.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADERS_S = 10.0
"""From a request's first byte, or a connection's opening, to the end of its headers."""
BODY_IDLE_S = 30.0
"""Longest silence while a request's body is being sent."""
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 41\r\n\r\nthe request was not sent in time: closed\n"
)


class TimedHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` that closes a connection whose client stalls (see the module)."""

    _read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._expect(headers=True)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._expect(headers=True)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._expect(headers=False)  # until the message completes, which a bodiless one does at once

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._expect(headers=False)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._stop_waiting()

    def _expect(self, *, headers: bool) -> None:
        self._stop_waiting()
        seconds = HEADERS_S if headers else BODY_IDLE_S
        self._read_timer = self.loop.call_later(seconds, self._timed_out, headers)

    def _stop_waiting(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _timed_out(self, headers: bool) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.flow is not None and self.flow.read_paused:  # the app has not read what came
            self._expect(headers=headers)
            return
        # Headers late: the cycle is the last request's, done (or none yet). A body late: it is
        # this request's, which may not be answered yet.
        if self.cycle is None or (
            self.cycle.response_complete if headers else not self.cycle.response_started
        ):
            self.transport.write(_TIMED_OUT)
        self.transport.close()
