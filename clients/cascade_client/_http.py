"""httpx glue both clients share: settings, request arguments, reply checks, error translation."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import httpx

from cascade_client.protocol import (
    DEFAULT_SERVER,
    DUPLEX,
    CascadeConnectionError,
    JsonCall,
    RequestSpec,
    error_from_body,
)

H = TypeVar("H", httpx.Client, httpx.AsyncClient)
R = TypeVar("R")


class ClientBase(Generic[H]):
    """What the sync and the async client hold: the httpx client and whether uploads are duplex."""

    def __init__(self, http: H, duplex: bool) -> None:
        self._http: H = http
        self._duplex = duplex

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


def drive(http: httpx.Client, call: JsonCall[R]) -> R:
    """Run a protocol request/reply exchange: send each request it yields, hand it the reply."""
    spec = next(call)
    while True:
        reply = json_reply(http.request(**request_args(spec)), spec)
        try:
            spec = call.send(reply)
        except StopIteration as done:
            return done.value


async def adrive(http: httpx.AsyncClient, call: JsonCall[R]) -> R:
    """``drive`` over an ``httpx.AsyncClient``."""
    spec = next(call)
    while True:
        reply = json_reply(await http.request(**request_args(spec)), spec)
        try:
            spec = call.send(reply)
        except StopIteration as done:
            return done.value


@contextlib.contextmanager
def transport_errors(server: httpx.URL) -> Iterator[None]:
    """Network failures as ``CascadeConnectionError`` (one-line message naming the server)."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise CascadeConnectionError(0, f"timed out talking to {server}: {exc}") from exc
    except httpx.TransportError as exc:
        raise CascadeConnectionError(0, f"cannot reach {server}: {exc or type(exc).__name__}") from exc
