"""httpx glue both clients share: settings, request arguments, reply checks, error translation,
and the retry loop (``send``/``asend``: what is retried and when is ``cascade_client.retry``'s)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import httpx

from cascade_client.protocol import (
    DEFAULT_SERVER,
    DUPLEX,
    CascadeConnectionError,
    CascadeError,
    JsonCall,
    RequestSpec,
    cut_stream,
    error_from_body,
)
from cascade_client.retry import RETRY_STATUSES, Attempts, RetryPolicy, retry_after_seconds

H = TypeVar("H", httpx.Client, httpx.AsyncClient)
R = TypeVar("R")


class ClientBase(Generic[H]):
    """What the sync and the async client hold: the httpx client and whether uploads are duplex."""

    def __init__(self, http: H, duplex: bool, retry: RetryPolicy | None) -> None:
        self._http: H = http
        self._duplex = duplex
        self._retry = retry if retry is not None else RetryPolicy()

    @property
    def server(self) -> httpx.URL:
        return self._http.base_url


def client_options(server: str | None, api_key: str | None, timeout: float) -> dict[str, Any]:
    """``httpx.Client``/``AsyncClient`` arguments; ``CASCADE_SERVER``/``CASCADE_API_KEY`` fill gaps.

    ``timeout`` bounds each read: a codec stream may legitimately be silent for a long segment.
    """
    server = server or os.environ.get("CASCADE_SERVER") or DEFAULT_SERVER
    api_key = api_key or os.environ.get("CASCADE_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return {"base_url": server, "headers": headers, "timeout": httpx.Timeout(timeout, connect=min(timeout, 30.0))}


def request_args(spec: RequestSpec, *, duplex: bool = False, content: Any = None) -> dict[str, Any]:
    """Keyword arguments of ``httpx`` ``request``/``stream`` for a spec (with a streamed body)."""
    args: dict[str, Any] = {"method": spec.method, "url": spec.path, "params": dict(spec.params),
                            "headers": dict(spec.headers)}
    if spec.json is not None:
        args["json"] = spec.json
    if content is not None:
        args["content"] = content
        args["extensions"] = {DUPLEX: duplex}
    return args


def json_reply(response: httpx.Response, spec: RequestSpec | None = None) -> Any:
    """The decoded body of a read reply (raw bytes where ``spec`` asks), or the typed error it carries."""
    if response.is_error:
        raise error_from_body(response.status_code, response.content)
    return response.content if spec is not None and spec.binary_reply else response.json()


# Failures before any byte of the answer: the request can be sent again (``retry``).
RETRYABLE_TRANSPORT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
                              httpx.WriteError)


def connection_error(server: httpx.URL, exc: httpx.TransportError) -> CascadeConnectionError:
    """A network failure as ``CascadeConnectionError`` (one-line message naming the server)."""
    if isinstance(exc, httpx.TimeoutException):
        return CascadeConnectionError(0, f"timed out talking to {server}: {exc}")
    return CascadeConnectionError(0, f"cannot reach {server}: {exc or type(exc).__name__}")


def broken_stream(server: httpx.URL, exc: httpx.TransportError) -> CascadeError:
    """A reply stream that broke after it started, naming a read timeout as a stall."""
    return cut_stream(server, exc, stalled=isinstance(exc, httpx.TimeoutException))


class Retrier:
    """One request's attempts: turns each failed attempt into a wait, or into the error to raise."""

    def __init__(self, http: httpx.Client | httpx.AsyncClient, policy: RetryPolicy,
                 replayable: Callable[[], bool]) -> None:
        self._server = http.base_url
        self._policy = policy
        self._attempts: Attempts = policy.start()
        self._replayable = replayable

    def after_transport_error(self, exc: httpx.TransportError) -> float:
        """Seconds to wait before sending again; raises the connection error when it is not retried."""
        error = connection_error(self._server, exc)
        retryable = isinstance(exc, RETRYABLE_TRANSPORT_ERRORS)
        return self._wait_or_raise(error, None, retryable, exc)

    def after_reply(self, response: httpx.Response) -> float:
        """Seconds to wait after a 429/502/503 answer (its body read); raises its typed error otherwise."""
        error = error_from_body(response.status_code, response.content)
        return self._wait_or_raise(error, retry_after_seconds(response.headers), True, None)

    def _wait_or_raise(self, error: CascadeError, retry_after: float | None, retryable: bool,
                       cause: BaseException | None) -> float:
        if not retryable or self._policy.attempts == 1:
            raise error from cause
        if not self._replayable():
            raise error.after_attempts(self._attempts.made, "not sent again: its body was read once and cannot be "
                                                            "replayed") from cause
        delay = self._attempts.wait(retry_after)
        if delay is None:
            raise error.after_attempts(self._attempts.made, self._attempts.summary()) from cause
        return delay


def send(http: httpx.Client, build: Callable[[], httpx.Request], policy: RetryPolicy,
         replayable: Callable[[], bool] = lambda: True) -> httpx.Response:
    """Send until an answer that is not retried arrives; return it with its body unread (a stream).

    A 429/502/503 answer or a connection that failed before the answer's first byte is retried while
    ``policy`` allows and the body can be sent again (``replayable``); any other error answer is
    raised as its typed exception."""
    retrier = Retrier(http, policy, replayable)
    while True:
        try:
            response = http.send(build(), stream=True)
        except httpx.TransportError as exc:
            time.sleep(retrier.after_transport_error(exc))
            continue
        if not response.is_error:
            return response
        with contextlib.closing(response):
            response.read()
            if response.status_code not in RETRY_STATUSES:
                raise error_from_body(response.status_code, response.content)
            delay = retrier.after_reply(response)
        time.sleep(delay)


async def asend(http: httpx.AsyncClient, build: Callable[[], httpx.Request], policy: RetryPolicy,
                replayable: Callable[[], bool] = lambda: True) -> httpx.Response:
    """``send`` over an ``httpx.AsyncClient``."""
    retrier = Retrier(http, policy, replayable)
    while True:
        try:
            response = await http.send(build(), stream=True)
        except httpx.TransportError as exc:
            await asyncio.sleep(retrier.after_transport_error(exc))
            continue
        if not response.is_error:
            return response
        try:
            await response.aread()
            if response.status_code not in RETRY_STATUSES:
                raise error_from_body(response.status_code, response.content)
            delay = retrier.after_reply(response)
        finally:
            await response.aclose()
        await asyncio.sleep(delay)


def drive(http: httpx.Client, call: JsonCall[R], policy: RetryPolicy) -> R:
    """Run a protocol request/reply exchange: send each request it yields (retried as ``send``
    says), hand it the reply."""
    spec = next(call)
    while True:
        response = send(http, functools.partial(http.build_request, **request_args(spec)), policy)
        with contextlib.closing(response):
            response.read()
        reply = json_reply(response, spec)
        try:
            spec = call.send(reply)
        except StopIteration as done:
            return done.value


async def adrive(http: httpx.AsyncClient, call: JsonCall[R], policy: RetryPolicy) -> R:
    """``drive`` over an ``httpx.AsyncClient``."""
    spec = next(call)
    while True:
        response = await asend(http, functools.partial(http.build_request, **request_args(spec)), policy)
        try:
            await response.aread()
        finally:
            await response.aclose()
        reply = json_reply(response, spec)
        try:
            spec = call.send(reply)
        except StopIteration as done:
            return done.value


@contextlib.contextmanager
def transport_errors(server: httpx.URL) -> Iterator[None]:
    """Network failures as ``CascadeConnectionError`` (one-line message naming the server)."""
    try:
        yield
    except httpx.TransportError as exc:
        raise connection_error(server, exc) from exc
