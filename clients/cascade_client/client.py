"""Streaming-first Python client for Cascade's codec and k-CBS endpoints (sync API, httpx)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import httpx

DEFAULT_SERVER = "http://127.0.0.1:8000"
CHUNK = 1 << 16


class CascadeError(Exception):
    """The server answered with an error; carries its status, message and code."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.code = code


@dataclass(frozen=True)
class CompressStats:
    bytes_in: int
    bytes_out: int
    tokens: int
    bits_per_byte: float
    seconds: float


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    response.read()
    try:
        error = response.json()["error"]
        raise CascadeError(response.status_code, error["message"], error.get("code"))
    except (ValueError, KeyError, TypeError):
        raise CascadeError(response.status_code, response.text[:500]) from None


def _events(lines: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    name = "message"
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            yield name, json.loads(line[6:])
            name = "message"


def _read_chunks(source: IO[bytes]) -> Iterator[bytes]:
    while chunk := source.read(CHUNK):
        yield chunk


class CascadeClient:
    """``compress_to`` / ``decompress_to`` stream between file-like objects and the server, never
    holding a whole file; ``kcbs`` runs a beam search."""

    def __init__(self, server: str | None = None, api_key: str | None = None, timeout: float = 3600) -> None:
        server = server or os.environ.get("CASCADE_SERVER", DEFAULT_SERVER)
        api_key = api_key or os.environ.get("CASCADE_API_KEY")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=server, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CascadeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def compress_to(self, sink: IO[bytes], source: IO[bytes], **params: Any) -> CompressStats:
        """Stream ``source`` to /compress and write each container chunk to ``sink`` as it arrives."""
        query = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items() if v is not None}
        with self._http.stream("POST", "/compress", content=_read_chunks(source), params=query,
                               headers={"content-type": "text/plain", "accept": "text/event-stream"}) as response:
            _raise_for(response)
            for name, event in _events(response.iter_lines()):
                if name == "chunk":
                    sink.write(base64.b64decode(event["data"]))
                elif name == "error":
                    error = event["error"]
                    raise CascadeError(400, error["message"], error.get("code"))
                elif name == "done":
                    sink.flush()
                    return CompressStats(event["bytes_in"], event["bytes_out"], event["tokens"],
                                         event["bits_per_byte"], event["seconds"])
        raise CascadeError(502, "stream ended without a 'done' event")

    def decompress_to(self, sink: IO[bytes], source: IO[bytes]) -> int:
        """Stream a container to /decompress and write verified segments to ``sink``; returns bytes."""
        written = 0
        with self._http.stream("POST", "/decompress", content=_read_chunks(source),
                               headers={"content-type": "application/octet-stream",
                                        "accept": "text/event-stream"}) as response:
            _raise_for(response)
            for name, event in _events(response.iter_lines()):
                if name == "text":
                    data = event["text"].encode() if "text" in event else base64.b64decode(event["data_b64"])
                    sink.write(data)
                    written += len(data)
                elif name == "error":
                    error = event["error"]
                    raise CascadeError(400, error["message"], error.get("code"))
                elif name == "done":
                    sink.flush()
                    return written
        raise CascadeError(502, "stream ended without a 'done' event")

    def compress(self, data: bytes, **params: Any) -> bytes:
        import io

        out = io.BytesIO()
        self.compress_to(out, io.BytesIO(data), **params)
        return out.getvalue()

    def decompress(self, container: bytes) -> bytes:
        import io

        out = io.BytesIO()
        self.decompress_to(out, io.BytesIO(container))
        return out.getvalue()

    def kcbs(self, prompt: str, beam_width: int, steps: int, **params: Any) -> dict[str, Any]:
        model = params.pop("model", None) or self._http.get("/v1/models").json()["data"][0]["id"]
        response = self._http.post("/v1/kcbs", json={"model": model, "prompt": prompt, "beam_width": beam_width,
                                                     "steps": steps, **params})
        _raise_for(response)
        result: dict[str, Any] = response.json()
        return result
