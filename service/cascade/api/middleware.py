"""One ASGI middleware for what every request needs: id, auth, body limit, admission, metrics, log.

Pure ASGI (not ``BaseHTTPMiddleware``) so streaming bodies and client disconnects pass through
untouched: a dropped SSE client must cancel the handler, which aborts the engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cascade.api.errors import error_body, unexpected_error
from cascade.metrics import Metrics
from cascade.settings import Settings

logger = logging.getLogger("cascade.access")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_OPEN_PATHS = frozenset({"/health"})
_ADMITTED_PATHS = frozenset({"/compress", "/decompress", "/tokenize", "/detokenize"})
"""Besides ``/v1/…``: the routes that take an in-flight slot (probes and scrapes never do)."""


class BodyRefusedError(Exception):
    """The request body passed its size limit or took too long to arrive. Carries the answer
    (status, message, code), so a route whose stream already started can send it as an error event."""

    def __init__(self, status: int = 400, message: str = "", code: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class BodyReader:
    """The app's ``receive``, counting body bytes against the route's limit (413) and the time spent
    waiting for them against a budget (408): a client trickling its body holds an admission slot, so
    the wait is bounded in total, not per chunk. The budget is ``timeout`` plus one second per
    ``min_rate`` bytes received, so a large upload over a slow but honest link still completes.
    Once the body is complete, ``receive`` only reports the disconnect and is no longer timed."""

    def __init__(self, receive: Receive, limit: int, timeout: float, min_rate: float) -> None:
        self._receive = receive
        self.limit = limit
        self.timeout = timeout
        self.min_rate = min_rate
        self.received = 0
        self.waited = 0.0
        self.complete = False
        self.cut_off = False
        """The client went away before its body was complete."""
        self.refused: tuple[int, str, str] | None = None

    async def receive(self) -> Message:
        if self.complete:
            return await self._receive()
        started = time.monotonic()
        budget = self.timeout + self.received / self.min_rate
        try:
            message = await asyncio.wait_for(self._receive(), max(budget - self.waited, 0.0))
        except TimeoutError:
            self.refused = (408, f"The request body did not arrive in time ({self.received} bytes in {budget:.0f} s; "
                                 "body_timeout_seconds)", "body_timeout")
            raise BodyRefusedError(*self.refused) from None
        self.waited += time.monotonic() - started
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
            if self.received > self.limit:
                self.refused = (413, f"Request body is larger than the limit of {self.limit} bytes", "body_too_large")
                raise BodyRefusedError(*self.refused)
        else:
            self.cut_off = message["type"] == "http.disconnect"
            self.complete = True
        return message


def sanitize_request_id(value: str | None) -> str:
    """A client-supplied ``X-Request-Id`` is kept only when it is short and path-safe."""
    if value and _SAFE_ID.match(value) and not value.startswith("."):
        return value
    return uuid.uuid4().hex


def request_ids(value: str | None) -> tuple[str, str]:
    """(the id echoed in ``X-Request-Id`` and logged, the server-unique id engine requests derive from).

    The client's id is never the engine's: retries and proxies reuse trace ids, and engine aborts go
    by id, so a shared id would let one client's hang-up abort another client's request."""
    internal = uuid.uuid4().hex
    echoed = sanitize_request_id(value)
    return (echoed if value and echoed == value else internal), internal


def body_limit_for(path: str, settings: Settings) -> int:
    """Per-route body limits (the codec takes larger bodies than chat)."""
    for prefix, limit in settings.route_body_limits.items():
        if path.startswith(prefix):
            return limit
    return settings.max_body_bytes


class GatewayMiddleware:
    """Request id, Bearer auth, body-size limit, in-flight cap (429), metrics and an access log."""

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics, routes: Sequence[BaseRoute] = (),
                 engine_dead: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        self.routes = routes
        self.settings = settings
        self.metrics = metrics
        self.engine_dead = engine_dead
        self.inflight = 0
        self._key = settings.api_key.get_secret_value().encode() if settings.api_key else None

    async def _reply(self, send: Send, status: int, message: str, code: str | None = None,
                     headers: dict[str, str] | None = None) -> None:
        body = json.dumps(error_body(status, message, code=code)).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})

    async def _unexpected(self, send: Send, exc: Exception, path: str, rid: str) -> None:
        error = unexpected_error(exc, self.engine_dead())
        if error.status == 500:
            logger.error("unhandled error", exc_info=exc, extra={"path": path, "request_id": rid})
        await self._reply(send, error.status, error.message, code=error.code, headers=error.headers)

    async def _deadline_passed(self, send: Send, status: dict[str, Any], deadline: float | None) -> None:
        """``request_timeout_seconds`` passed (the handler was cancelled, aborting its engine requests):
        504 when nothing was sent yet, an error event closing an event stream, else a cut-off body."""
        message = f"The request did not complete within its deadline of {deadline:g} s (request_timeout_seconds)"
        if not status["started"]:
            await self._reply(send, 504, message, code="deadline_exceeded")
            return
        if not status.get("sse"):
            raise TimeoutError(message)
        payload = error_body(504, message, code="deadline_exceeded")
        payload["error"]["status"] = 504
        event = b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": False})

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        if self._key is None:
            return True
        supplied = headers.get(b"authorization", b"")
        scheme, _, token = supplied.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        path: str = scope["path"]
        rid, internal_id = request_ids(headers.get(b"x-request-id", b"").decode("latin-1"))
        state = scope.setdefault("state", {})
        state["request_id"], state["client_request_id"] = internal_id, rid
        started = time.monotonic()
        status_holder: dict[str, Any] = {"status": 500, "started": False}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                status_holder["started"] = True
                status_holder["sse"] = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                           for k, v in message.get("headers", []))
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        async def app_send(message: Message) -> None:
            # A handler that caught the body-limit error or the hang-up while parsing (FastAPI turns
            # either into "error parsing the body", 400) must not answer: the client gets the 413 / 408
            # below instead, or nothing (it is gone) and the request counts as a 499.
            if (body.refused is not None or body.cut_off) and not status_holder["started"]:
                return
            await send_wrapper(message)

        route = route_label(self.routes, scope)
        try:
            if path not in _OPEN_PATHS and not self._authorized(headers):
                await self._reply(send_wrapper, 401, "Invalid or missing API key (use 'Authorization: Bearer "
                                  "<key>')", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                return
            limit = body_limit_for(path, self.settings)
            declared = headers.get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                await self._reply(send_wrapper, 413, f"Request body is larger than the limit of {limit} bytes",
                                  code="body_too_large")
                return
            encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
            if encoding not in ("", "identity") and scope["method"] in ("POST", "PUT", "PATCH"):
                await self._reply(send_wrapper, 415, f"Content-Encoding {encoding!r} is not supported: send the "
                                  "body uncompressed", code="unsupported_content_encoding")
                return
            admitted = path.startswith("/v1/") or path in _ADMITTED_PATHS
            if admitted and self.inflight >= self.settings.max_concurrent_requests:
                await self._reply(send_wrapper, 429, "Too many requests in flight; retry shortly",
                                  code="overloaded", headers={"Retry-After": "1"})
                return
            body = BodyReader(receive, limit, self.settings.body_timeout_seconds, self.settings.body_min_rate_bytes)
            deadline = self.settings.request_timeout_seconds if path.startswith("/v1/") else None
            slot = 1 if admitted else 0  # probes and scrapes never take a slot a request could need
            self.inflight += slot
            self.metrics.inflight.inc(slot)
            try:
                timer = asyncio.timeout(deadline)
                try:
                    async with timer:
                        with contextlib.suppress(BodyRefusedError):
                            await self.app(scope, body.receive, app_send)
                except Exception as exc:
                    if isinstance(exc, TimeoutError) and timer.expired():
                        await self._deadline_passed(send_wrapper, status_holder, deadline)
                    elif body.cut_off:
                        pass  # the client hung up mid-upload (before or after our 200): nobody to answer
                    elif status_holder["started"]:
                        raise
                    else:
                        await self._unexpected(send_wrapper, exc, path, rid)
                if body.refused is not None and not status_holder["started"]:
                    await self._reply(send_wrapper, *body.refused)
                elif body.cut_off:
                    status_holder["status"] = 499  # counted as the client's, not as a 500 or a 200
            finally:
                self.inflight -= slot
                self.metrics.inflight.dec(slot)
        finally:
            elapsed = time.monotonic() - started
            status = status_holder["status"]
            self.metrics.requests.labels(route, scope["method"], str(status)).inc()
            self.metrics.latency.labels(route).observe(elapsed)
            logger.info("request", extra={"request_id": rid, "internal_id": internal_id, "method": scope["method"],
                                          "path": route, "status": status, "seconds": round(elapsed, 4)})


def route_label(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The matched route's path template (``/v1/models/{model:path}``), so label values stay bounded
    and always agree with the app's routes; ``other`` for paths no route serves."""
    for route in routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            return str(getattr(route, "path", "other"))
    return "other"
