"""Sources and sinks: what a client may read a body from and write a reply to, in chunks.

A source is bytes, a binary file-like (``read``), a socket (``recv``) or an iterable of bytes; a
sink is a binary file-like (``write``) or a socket (``sendall``). Nothing is ever read whole: a
file source is read ``CHUNK`` bytes at a time, and each decoded reply chunk is written at once.
The async client adds async readers/writers on top of these (see ``aio``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import IO, Any, Protocol, Union

from cascade_client.protocol import CHUNK, Progress


class Reader(Protocol):
    """Anything with a binary ``read(size)``: files, ``sys.stdin.buffer``, ``io.BytesIO``..."""

    def read(self, size: int, /) -> bytes: ...


class Writer(Protocol):
    """Anything with a binary ``write``: files, ``sys.stdout.buffer``, ``io.BytesIO``, your own class."""

    def write(self, data: bytes, /) -> object: ...


Source = Union[bytes, bytearray, memoryview, Reader, IO[bytes], socket.socket, Iterable[bytes]]  # noqa: UP007
Sink = Union[Writer, IO[bytes], socket.socket]  # noqa: UP007 (runtime aliases)


def _reader(source: Any) -> Callable[[], bytes] | None:
    if isinstance(source, socket.socket):
        return lambda: source.recv(CHUNK)
    read = getattr(source, "read", None)
    return (lambda: read(CHUNK)) if callable(read) else None


def check_endpoints(sink: Any, source: Any) -> None:
    """A clear ``TypeError`` before any request for what can be neither (a path or ``str`` most often)."""
    if isinstance(source, str | os.PathLike):
        raise TypeError(f"a source is bytes, a binary file, a socket or an iterable of bytes, not "
                        f"{type(source).__name__}: open a path with open(path, 'rb'), encode text with .encode()")
    if not isinstance(sink, socket.socket) and not callable(getattr(sink, "write", None)):
        raise TypeError(f"a sink is a binary file-like (write) or a socket, not {type(sink).__name__}"
                        + (": open a path with open(path, 'wb')" if isinstance(sink, str | os.PathLike) else ""))


def iter_source(source: Source) -> Iterator[bytes]:
    """The source as chunks of at most ``CHUNK`` bytes (empty chunks left out)."""
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        chunks: Iterable[bytes] = (bytes(view[i:i + CHUNK]) for i in range(0, len(view), CHUNK))
    elif (read := _reader(source)) is not None:
        chunks = iter(read, b"")
    else:
        chunks = source  # type: ignore[assignment]
    for chunk in chunks:
        if chunk:
            yield bytes(chunk)


class Body:
    """A request body that a retry can send again: each ``chunks()`` starts from the beginning.

    Bytes are sliced afresh; a regular file (anything with a ``fileno`` on a regular file) is read
    with positional reads from where it stood, so a reader thread of a failed attempt that is still
    finishing its last read cannot move what the next attempt reads; any other source (a pipe,
    stdin, a socket, an iterator) can be sent again only while none of it has been read.
    """

    def __init__(self, source: Source, progress: Progress | None = None) -> None:
        self._source = source
        self._progress = progress
        self._offset = _regular_file_offset(source)
        self.started = False

    @property
    def replayable(self) -> bool:
        return (not self.started or isinstance(self._source, bytes | bytearray | memoryview)
                or self._offset is not None)

    def chunks(self) -> Iterator[bytes]:
        if not self.replayable:
            raise RuntimeError("this body was partly sent and cannot be read again")
        if self._offset is not None:
            chunks: Iterable[bytes] = _pread_chunks(self._source.fileno(), self._offset)  # type: ignore[union-attr]
        else:
            chunks = iter_source(self._source)
        for chunk in chunks:
            self.started = True
            if self._progress is not None:
                self._progress.sent(len(chunk))
            yield chunk


def _regular_file_offset(source: Any) -> int | None:
    """Where a file source on a regular file stands (its next byte), else ``None``."""
    try:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            return None
        return int(source.tell())
    except (AttributeError, OSError, ValueError):
        return None


def _pread_chunks(fd: int, offset: int) -> Iterator[bytes]:
    while chunk := os.pread(fd, CHUNK, offset):
        offset += len(chunk)
        yield chunk


def write_sink(sink: Sink, data: bytes) -> None:
    """Write all of ``data`` (a socket gets ``sendall``, a raw file is written until done)."""
    if isinstance(sink, socket.socket):
        sink.sendall(data)
        return
    while data:
        written = sink.write(data)
        # Buffered files write everything; a raw file or pipe may take less (None: treat as all).
        data = data[written:] if isinstance(written, int) else b""


def flush_sink(sink: Any) -> None:
    flush = getattr(sink, "flush", None)
    if callable(flush):
        flush()


_END = object()


async def from_thread(chunks: Iterator[bytes], depth: int = 4) -> AsyncIterator[bytes]:
    """A blocking iterator (file, pipe, socket reads) as an async one, read on a daemon thread.

    Not ``asyncio.to_thread``: its executor threads are joined at interpreter exit, so a read
    blocked on a silent stdin would keep an interrupted or failed command from ever exiting. At
    most ``depth`` chunks are read ahead; when the consumer stops, the thread stops after its
    current read.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    room = threading.Semaphore(depth)
    stop = threading.Event()

    def put(item: Any) -> None:
        # A callback, not a coroutine: a loop that closes first leaves no un-awaited coroutine behind.
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody reads any more
            stop.set()

    def pump() -> None:
        item: Any = _END
        try:
            for chunk in chunks:
                room.acquire()
                if stop.is_set():
                    return
                put(chunk)
        except BaseException as exc:  # handed to the consumer, raised there
            item = exc
        if not stop.is_set():
            put(item)

    threading.Thread(target=pump, name="cascade-source", daemon=True).start()
    try:
        while (item := await queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            room.release()
            yield item
    finally:
        stop.set()
        room.release()  # a pump waiting for room sees ``stop``
