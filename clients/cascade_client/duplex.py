"""Full-duplex HTTP/1.1 for the streaming codec calls: upload and download at the same time.

httpx (like most HTTP clients) sends the whole request body before it reads the reply. For
``/compress`` that is worse than slow: the server reads the body only as fast as it codes it and
streams the container back meanwhile, so once the unread reply fills the socket buffers the
server stops reading, the client's upload blocks, and both wait forever (tens of MB of input are
enough). These transports send the body from a separate task while the response is read, so the
reply is consumed as it is produced whatever the input size.

Only requests carrying the ``DUPLEX`` extension take this path (one fresh connection each, HTTP/1.1
framed by h11, which httpx's own HTTP/1.1 stack is built on); everything else goes to httpx's
normal pooled transport. The sync transport runs the same coroutine on a private event-loop
thread, so there is one implementation of the exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, TypeVar

import h11
import httpx

from cascade_client._io import from_thread
from cascade_client.protocol import CHUNK, DUPLEX

T = TypeVar("T")


def _ssl_context(verify: bool | ssl.SSLContext) -> ssl.SSLContext:
    if isinstance(verify, ssl.SSLContext):
        return verify
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class _Exchange(httpx.AsyncByteStream):
    """One request/response on its own connection; the body is uploaded by a background task."""

    def __init__(self, request: httpx.Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._request = request
        self._reader, self._writer = reader, writer
        self._h11 = h11.Connection(h11.CLIENT)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        self._read_timeout, self._write_timeout = timeouts.get("read"), timeouts.get("write")
        self._upload: asyncio.Task[None] | None = None
        self._upload_error: BaseException | None = None

    async def _send(self, event: h11.Event) -> None:
        data = self._h11.send(event)
        if data:
            self._writer.write(data)
            try:
                await asyncio.wait_for(self._writer.drain(), self._write_timeout)
            except TimeoutError:
                raise httpx.WriteTimeout("the server read none of the body in time", request=self._request) from None

    async def _send_body(self, event: h11.Event) -> bool:
        """Send part of the body; False once the server has closed its side (it answered early,
        e.g. 401 or 413, without reading the rest: its reply says why)."""
        try:
            await self._send(event)
        except (OSError, h11.LocalProtocolError):
            return False
        return True

    async def _upload_body(self) -> None:
        """Send the body; a source failure (or write timeout) aborts the exchange and is reported."""
        try:
            assert isinstance(self._request.stream, httpx.AsyncByteStream)
            async for chunk in self._request.stream:
                if chunk and not await self._send_body(h11.Data(data=chunk)):
                    return
            await self._send_body(h11.EndOfMessage())
        except Exception as exc:
            self._upload_error = exc
            self._writer.transport.abort()

    async def _next_event(self) -> Any:
        while True:
            try:
                event = self._h11.next_event()
                if event is not h11.NEED_DATA:
                    return event
                data = await asyncio.wait_for(self._reader.read(CHUNK), self._read_timeout)
                self._h11.receive_data(data)
            except Exception as exc:
                raise self._read_failure(exc) from exc

    def _read_failure(self, exc: Exception) -> BaseException:
        if self._upload_error is not None:
            return self._upload_error
        if isinstance(exc, TimeoutError):
            return httpx.ReadTimeout("timed out reading the reply", request=self._request)
        if isinstance(exc, h11.RemoteProtocolError):
            return httpx.RemoteProtocolError(str(exc) or "server closed the connection", request=self._request)
        return httpx.ReadError(str(exc) or type(exc).__name__, request=self._request)

    async def start(self) -> httpx.Response:
        """Send the head, start the upload, and wait for the response head."""
        request = self._request
        target = request.url.raw_path
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"connection"] + [(b"connection", b"close")]
        if b"content-length" not in {k.lower() for k, _ in headers}:
            headers = [(k, v) for k, v in headers if k.lower() != b"transfer-encoding"]
            headers.append((b"transfer-encoding", b"chunked"))
        try:
            await self._send(h11.Request(method=request.method, target=target, headers=headers))
        except (OSError, TimeoutError) as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
        self._upload = asyncio.create_task(self._upload_body())
        event = await self._next_event()
        while isinstance(event, h11.InformationalResponse):
            event = await self._next_event()
        assert isinstance(event, h11.Response)
        return httpx.Response(event.status_code, headers=list(event.headers.raw_items()), stream=self,
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": event.reason})

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return

    async def aclose(self) -> None:
        if self._upload is not None and not self._upload.done():
            self._upload.cancel()
            await asyncio.gather(self._upload, return_exceptions=True)
        self._writer.close()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await self._writer.wait_closed()


async def exchange(request: httpx.Request, verify: bool | ssl.SSLContext = True) -> httpx.Response:
    """Open a connection and run ``request`` full-duplex; the response streams from it."""
    url = request.url
    https = url.scheme == "https"
    connect = request.extensions.get("timeout", {}).get("connect")
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(url.host, url.port or (443 if https else 80),
                                    ssl=_ssl_context(verify) if https else None), connect)
    except TimeoutError as exc:
        raise httpx.ConnectTimeout(f"could not connect to {url.host} in {connect} s", request=request) from exc
    except OSError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    flow = _Exchange(request, reader, writer)
    try:
        return await flow.start()
    except BaseException:
        await flow.aclose()
        raise


class AsyncDuplexTransport(httpx.AsyncBaseTransport):
    """httpx transport: ``DUPLEX`` requests full-duplex, the rest through ``fallback``."""

    def __init__(self, fallback: httpx.AsyncBaseTransport | None = None, verify: bool | ssl.SSLContext = True) -> None:
        self._fallback = fallback or httpx.AsyncHTTPTransport(verify=verify)
        self._verify = verify

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.extensions.get(DUPLEX):
            return await exchange(request, self._verify)
        return await self._fallback.handle_async_request(request)

    async def aclose(self) -> None:
        await self._fallback.aclose()


class _AsyncSource(httpx.AsyncByteStream):
    """A sync request body read from a worker thread, so a slow source never stalls the download."""

    def __init__(self, stream: httpx.SyncByteStream) -> None:
        self._iterator = iter(stream)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in from_thread(self._iterator):
            yield chunk


class _SyncReply(httpx.SyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, transport: SyncDuplexTransport) -> None:
        self._stream, self._transport = stream, transport

    def __iter__(self) -> Iterator[bytes]:
        chunks = aiter(self._stream)
        while (chunk := self._transport.call(anext(chunks, None))) is not None:
            yield chunk

    def close(self) -> None:
        self._transport.call(self._stream.aclose())


class SyncDuplexTransport(httpx.BaseTransport):
    """The sync face of ``exchange``: it runs on a private event-loop thread started on first use."""

    def __init__(self, fallback: httpx.BaseTransport | None = None, verify: bool | ssl.SSLContext = True) -> None:
        self._fallback = fallback or httpx.HTTPTransport(verify=verify)
        self._verify = verify
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the loop thread and wait; an interrupt here cancels it there."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="cascade-duplex", daemon=True)
                self._thread.start()
        future = asyncio.run_coroutine_threadsafe(_awaited(coro), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not request.extensions.get(DUPLEX):
            return self._fallback.handle_request(request)
        assert isinstance(request.stream, httpx.SyncByteStream)
        inner = httpx.Request(request.method, request.url, headers=request.headers, stream=_AsyncSource(request.stream),
                              extensions=request.extensions)
        response = self.call(exchange(inner, self._verify))
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                              stream=_SyncReply(response.stream, self))

    def close(self) -> None:
        self._fallback.close()
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
