"""uvicorn's httptools protocol with the limits it lacks: header size and count (431) and a deadline
for receiving a request's headers (408); a request it cannot parse gets its 400 in OpenAI's error
shape too (uvicorn's own is plain text).

Without them one client can make the server buffer a 64 MB header, send 10,000 headers, or hold a
connection open forever by trickling a request line byte by byte. The limits act while bytes are
parsed, before any request reaches the app, so a refused request costs at most ``max_header_bytes``
of memory. (Slow *bodies* are the gateway middleware's job: it owns the admission slot they hold.)

It also closes a connection the way a client can read: a handler may answer before the upload ended
(a container refused by its first bytes, a 413), and the protocol itself refuses headers before they
ended (a 431: clients such as httpx send the whole request before they read), and closing a socket
with request bytes still unread makes the kernel send a reset that can destroy the answer on its way
to the client. So the protocol lingers: it sends its answer and a FIN, reads and discards what the
client still sends for up to ``LINGER_SECONDS`` (after a refused header, up to another
``max_bytes`` of it: a client streaming a huge header still meets a reset soon), and closes then
(or when the client closes first).
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cascade.api.errors import error_body


@dataclass(frozen=True)
class HeaderLimits:
    max_bytes: int
    max_count: int
    timeout: float


LINGER_SECONDS = 5.0


class LingeringTransport:
    """The connection's transport, whose ``close`` lingers while the request body is still arriving
    (see the module docstring); every other attribute is the transport's own."""

    def __init__(self, transport: asyncio.Transport, body_unread: Callable[[], bool],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._body_unread = body_unread
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._budget = math.inf
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        if self.lingering or not self._body_unread():
            self.abandon()
        else:
            self.linger()

    def linger(self, budget: float = math.inf) -> None:
        """Send what is written and a FIN, then drop what the client still sends, for up to
        ``LINGER_SECONDS`` and ``budget`` bytes, before closing."""
        if self.lingering:
            return
        if self._transport.is_closing() or not self._transport.can_write_eof():
            self.abandon()
            return
        self.lingering = True
        self._budget = budget
        self._transport.resume_reading()
        self._transport.write_eof()
        self._timer = self._loop.call_later(LINGER_SECONDS, self.abandon)

    def drop(self, received: int) -> None:
        """Bytes read while lingering: dropped, and past the budget the connection closes."""
        self._budget -= received
        if self._budget < 0:
            self.abandon()

    def abandon(self) -> None:
        """Close now, lingering or not."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()


class HeaderLimitError(Exception):
    """Raised from a parser callback to stop parsing; ``send_400_response`` then sends the refusal."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """Counts header bytes as they arrive (before httptools has buffered a whole huge header) and as
    they are parsed (a chunk holding whole headers), counts header lines, and closes connections
    whose headers do not arrive in time."""

    limits = HeaderLimits(max_bytes=65536, max_count=100, timeout=10.0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_headers = False
        self._header_bytes = 0
        self._header_count = 0
        self._parsed_bytes = 0
        self._refusal: tuple[int, str] | None = None
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._lingering = LingeringTransport(transport, self._body_unread, self.loop)
        super().connection_made(cast(asyncio.Transport, self._lingering))
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._lingering.abandon()
        super().connection_lost(exc)

    def _body_unread(self) -> bool:
        return self.cycle is not None and self.cycle.more_body and not self._in_headers

    def data_received(self, data: bytes) -> None:
        if self._lingering.lingering:
            self._lingering.drop(len(data))
            return
        super().data_received(data)
        if self._in_headers and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_bytes:
                self._refuse(431, f"Request headers are larger than the limit of {self.limits.max_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers, self._header_bytes, self._header_count, self._parsed_bytes = True, 0, 0, 0
        self._arm_header_timer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._parsed_bytes += len(name) + len(value) + 4
        if self._header_count > self.limits.max_count:
            self._refusal = (431, f"More than {self.limits.max_count} request headers")
            raise HeaderLimitError
        if self._parsed_bytes > self.limits.max_bytes:
            self._refusal = (431, f"Request headers are larger than the limit of {self.limits.max_bytes} bytes")
            raise HeaderLimitError
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_header_timer()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        """A limit's refusal, or httptools' parse error (a garbage request line, a bad header name,
        conflicting lengths, a bad chunk size) — in OpenAI's error shape like every other answer. Once a
        response has begun (a bad chunk further into a body the app already answers), another status line
        would corrupt it: the connection just closes. ``cycle`` is still the previous request's while a
        kept-alive connection's next request arrives; a request and response both finished do not stop
        this refusal."""
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not (cycle.response_complete and not cycle.more_body):
            self.transport.close()
            return
        self._refuse(*(self._refusal or (400, f"{msg.rstrip('.')}: the request line, a header or the body's "
                                              "framing could not be parsed")))

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.timeout, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or (self.cycle is not None and not self._in_headers):
            return
        if self._in_headers:
            self._refuse(408, f"Request headers did not arrive within {self.limits.timeout:g} s")
        else:
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer outside any request cycle (none exists yet) and close: the rest of the stream
        cannot be parsed reliably."""
        self._cancel_header_timer()
        code, reason = {400: ("invalid_http_request", b"Bad Request"), 408: ("request_timeout", b"Request Timeout"),
                        431: ("request_header_fields_too_large", b"Request Header Fields Too Large")}[status]
        body = json.dumps(error_body(status, message, code=code)).encode()
        rid = uuid.uuid4().hex.encode()  # the client's own id cannot be trusted from headers that failed
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"x-request-id: %s\r\nconnection: close\r\n\r\n%s"
                             % (status, reason, len(body), rid, body))
        self._lingering.linger(budget=self.limits.max_bytes)


def limited_protocol(limits: HeaderLimits) -> type[LimitedHttpProtocol]:
    """A protocol class carrying ``limits`` (uvicorn instantiates the class it is given)."""
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), {"limits": limits})
