"""The client's protocol, free of I/O, shared by the sync and the async client.

Everything that decides *what* goes over the wire and *what it means* lives here: request specs,
the decoders that turn codec events (received by ``httpx-sse``) into sink bytes and typed
results, the mapping of error bodies to typed exceptions, and the JSON calls written as generators (they yield
``RequestSpec`` and receive the decoded JSON reply). The two clients only move bytes, so an
endpoint added here (e.g. a future ``export_topk``) needs one generator or decoder and a one-line
method in each client.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from cascade_common.sse import Event
from cascade_common.topk_format import Header, TopkFormatError

from cascade_client.topk_document import TopkDocument, read_all

DEFAULT_SERVER = "http://127.0.0.1:8000"
CHUNK = 1 << 16
SSE = "text/event-stream"
DUPLEX = "cascade_duplex"
"""Request extension that asks the transport to upload and download at the same time."""

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


# --------------------------------------------------------------------------- errors


class CascadeError(Exception):
    """The server (or the way to it) failed; carries the server's status, message, type and code."""

    def __init__(self, status: int, message: str, code: str | None = None, *, type: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type
        self.param = param
        self.attempts = 1
        """How many times the request was sent before this error was raised (retries included)."""

    def after_attempts(self, attempts: int, summary: str) -> CascadeError:
        """The same error, of the same type, saying how many attempts the client made before giving up."""
        error = type(self)(self.status, f"{self.message} ({summary})", self.code, type=self.type, param=self.param)
        error.attempts = attempts
        return error


class BadRequestError(CascadeError):
    """400: the request (or the container) is invalid."""


class AuthenticationError(CascadeError):
    """401: missing or wrong API key."""


class NotFoundError(CascadeError):
    """404: unknown route or model."""


class ModelMismatchError(CascadeError):
    """409: the container was made with another model."""


class PayloadTooLargeError(CascadeError):
    """413: the input is above the server's limit."""


class IntegrityError(CascadeError):
    """422: a decoded segment failed its checksum or its payload ended before its tokens; no wrong bytes
    were returned."""


class RateLimitError(CascadeError):
    """429: too many requests in flight."""


class ServerError(CascadeError):
    """5xx: the server or its engine failed."""


class ServiceUnavailableError(ServerError):
    """503: an engine is not ready (the codec self-test failed, or the engine is starting)."""


class CascadeConnectionError(CascadeError):
    """The server could not be reached or the connection broke (status 0: no HTTP answer)."""


_BY_STATUS: dict[int, type[CascadeError]] = {
    400: BadRequestError, 401: AuthenticationError, 404: NotFoundError, 409: ModelMismatchError,
    413: PayloadTooLargeError, 422: IntegrityError, 429: RateLimitError, 503: ServiceUnavailableError,
}
# Failures inside a 200 SSE stream carry the status the same failure gets before the stream starts;
# servers older than that field only carry a code, mapped here.
_STATUS_BY_CODE = {"model_mismatch": 409, "numerics_mismatch": 409, "checksum_mismatch": 422, "payload_overrun": 422,
                   "damaged_container": 422, "replay_mismatch": 422, "codec_unavailable": 503,
                   "engine_unavailable": 503, "internal_error": 500, "input_too_large": 413}


def error_for(status: int, error: Mapping[str, Any]) -> CascadeError:
    """The typed exception for an OpenAI-shaped ``error`` object."""
    if not status:
        carried = error.get("status")
        status = carried if isinstance(carried, int) and carried else _STATUS_BY_CODE.get(str(error.get("code")), 400)
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else CascadeError)
    return cls(status, str(error.get("message", "")), error.get("code"), type=error.get("type"),
               param=error.get("param"))


def error_from_body(status: int, body: bytes) -> CascadeError:
    """The typed exception for a non-2xx reply; non-JSON bodies keep their first 500 characters."""
    try:
        error = json.loads(body)["error"]
        if isinstance(error, Mapping):
            return error_for(status, error)
    except (ValueError, KeyError, TypeError):
        pass
    return error_for(status, {"message": body.decode("utf-8", "replace")[:500] or f"HTTP {status}"})


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CompressStats:
    """The ``done`` event of ``/compress``; ``bytes_out`` is the container size."""

    bytes_in: int
    bytes_out: int
    tokens: int
    bits_per_byte: float
    seconds: float
    segments: int = 0
    raw_segments: int = 0
    bits_per_token: float = 0.0
    compression_ratio: float = 0.0

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> CompressStats:
        return cls(int(event["bytes_in"]), int(event["bytes_out"]), int(event["tokens"]),
                   float(event["bits_per_byte"]), float(event["seconds"]), int(event.get("segments", 0)),
                   int(event.get("raw_segments", 0)), float(event.get("bits_per_token", 0.0)),
                   float(event.get("compression_ratio", 0.0)))


@dataclass(frozen=True)
class DecompressStats:
    """The ``done`` event of ``/decompress``: every segment was CRC-verified before it was written."""

    bytes: int
    segments: int
    verified: bool


@dataclass(frozen=True)
class KcbsSequence:
    text: str
    score: float
    probability: float
    finish_reason: str | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class TargetMatch:
    exact: bool
    near_verbatim_probability: float
    matches: tuple[Any, ...] = ()


@dataclass(frozen=True)
class KcbsResult:
    """``/v1/kcbs``'s answer; ``raw`` keeps the JSON as sent (the CLI prints it)."""

    sequences: tuple[KcbsSequence, ...]
    captured_probability: float
    target_match: TargetMatch | None
    usage: Mapping[str, Any]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> KcbsResult:
        sequences = tuple(KcbsSequence(s["text"], float(s["score"]), float(s["probability"]), s.get("finish_reason"),
                                       tuple(s.get("token_ids", ()))) for s in body["sequences"])
        match = body.get("target_match")
        target = None if match is None else TargetMatch(bool(match["exact"]),
                                                        float(match["near_verbatim_probability"]),
                                                        tuple(match.get("matches", ())))
        return cls(sequences, float(body["captured_probability"]), target, body.get("usage", {}), body)


# --------------------------------------------------------------------------- progress


class Progress(Protocol):
    """Told how far a transfer is (the CLI draws bars from it); called from the transfer's thread."""

    def sent(self, nbytes: int) -> None: ...

    def received(self, nbytes: int) -> None: ...


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class RequestSpec:
    """One HTTP request, before any client sends it."""

    method: str
    path: str
    params: Mapping[str, str | int] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    binary_reply: bool = False
    """The call is sent the reply's raw bytes instead of its decoded JSON."""


def query_params(params: Mapping[str, Any]) -> dict[str, str | int]:
    """Codec options as query parameters (the raw-body form of ``/compress``); ``None`` is left out. A
    string UTF-8 cannot carry (a lone surrogate) is refused here as the server would refuse it."""
    for key, value in params.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequestError(0, f"{key} is not valid Unicode text (it holds a lone surrogate)",
                                      "invalid_value", param=key) from None
    return {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items() if v is not None}


# --------------------------------------------------------------------------- SSE


class StreamDecoder(Protocol[R_co]):
    """Turns the events of one SSE reply into sink bytes and, at the end, a typed result."""

    def feed(self, event: Event) -> bytes | None:
        """Bytes to write for this event; raises the typed error for an ``error`` event."""

    def result(self) -> R_co:
        """The result once the stream is over; raises if it ended early."""


def _raise_event_error(event: Event) -> None:
    if event.name == "error" or (isinstance(event.data, Mapping) and "error" in event.data):
        raise error_for(0, event.data.get("error", {}) if isinstance(event.data, Mapping) else {})


def _truncated() -> CascadeError:
    return CascadeConnectionError(0, "the stream ended before its 'done' event (connection dropped?)")


class EventDecoder(Generic[R]):
    """Base of the codec decoders: ``payload_event`` events carry sink bytes, ``done`` ends the
    stream with the statistics, ``error`` raises. Subclasses say how to read the two."""

    payload_event = "chunk"

    def __init__(self) -> None:
        self._done: Mapping[str, Any] | None = None

    def feed(self, event: Event) -> bytes | None:
        _raise_event_error(event)
        if event.name == self.payload_event:
            return self.payload(event.data)
        if event.name == "done":
            self._done = event.data
        return None

    def result(self) -> R:
        if self._done is None:
            raise _truncated()
        return self.finish(self._done)

    def payload(self, data: Mapping[str, Any]) -> bytes:
        raise NotImplementedError

    def finish(self, done: Mapping[str, Any]) -> R:
        raise NotImplementedError


class CompressDecoder(EventDecoder[CompressStats]):
    """``chunk`` events carry base64 slices of the container, in order; ``done`` carries the stats."""

    payload_event = "chunk"

    def __init__(self) -> None:
        super().__init__()
        self._seq = 0

    def payload(self, data: Mapping[str, Any]) -> bytes:
        if data.get("seq", self._seq) != self._seq:
            raise CascadeError(0, f"chunk {data['seq']} arrived where chunk {self._seq} was due")
        self._seq += 1
        return base64.b64decode(data["data"])

    def finish(self, done: Mapping[str, Any]) -> CompressStats:
        return CompressStats.from_event(done)


class DecompressDecoder(EventDecoder[DecompressStats]):
    """``text`` events carry verified segments (UTF-8 text, or base64 when not UTF-8)."""

    payload_event = "text"

    def __init__(self) -> None:
        super().__init__()
        self._written = 0

    def payload(self, data: Mapping[str, Any]) -> bytes:
        raw = data["text"].encode() if "text" in data else base64.b64decode(data["data_b64"])
        self._written += len(raw)
        return raw

    def finish(self, done: Mapping[str, Any]) -> DecompressStats:
        stats = DecompressStats(int(done.get("bytes", self._written)), int(done.get("segments", 0)),
                                bool(done.get("verified")))
        if stats.bytes != self._written:
            raise CascadeError(0, f"server reported {stats.bytes} bytes but sent {self._written}")
        return stats


def event_from_sse(name: str, data: str) -> Event:
    """One received server-sent event (name and data as ``httpx-sse`` hands them) as an ``Event``:
    its data is JSON, or OpenAI's ``[DONE]``."""
    if data == "[DONE]":
        return Event(name or "message", None, done=True)
    try:
        return Event(name or "message", json.loads(data))
    except ValueError:
        raise CascadeError(0, f"the server sent a malformed {name or 'message'!r} event: {data[:200]!r}") from None


def cut_stream(server: object, exc: BaseException, *, stalled: bool = False) -> CascadeError:
    """A reply stream that broke (or went silent past the read timeout) after it started: an error,
    never a short result."""
    how = "stalled (nothing within the read timeout)" if stalled else "was cut"
    return CascadeConnectionError(0, f"the stream from {server} {how} before its 'done' event "
                                     f"({exc or type(exc).__name__}); nothing of it can be trusted as complete")


@dataclass(frozen=True)
class StreamCall(Generic[R]):
    """A streaming upload whose SSE reply is decoded into sink bytes and a result.

    Clients send ``request`` with the source as its body, pass every received event to ``feed``
    and write what it returns to the sink, then return ``finish()`` (which raises when the stream
    ended before its ``done`` event).
    """

    request: RequestSpec
    decoder: StreamDecoder[R]

    def feed(self, event: Event) -> bytes | None:
        return self.decoder.feed(event)

    def finish(self) -> R:
        return self.decoder.result()


def compress_call(**options: Any) -> StreamCall[CompressStats]:
    """``/compress`` with a raw body (never read whole) and options as query parameters."""
    return StreamCall(RequestSpec("POST", "/compress", query_params(options),
                                  {"content-type": "application/octet-stream", "accept": SSE}), CompressDecoder())


def decompress_call() -> StreamCall[DecompressStats]:
    return StreamCall(RequestSpec("POST", "/decompress", {},
                                  {"content-type": "application/octet-stream", "accept": SSE}), DecompressDecoder())


# --------------------------------------------------------------------------- JSON calls

JsonCall = Generator[RequestSpec, Any, R]
"""A request/reply exchange: yields requests, is sent each reply (decoded JSON, or bytes where the
spec says ``binary_reply``), returns the result."""


def default_model() -> JsonCall[str]:
    """The first model ``/v1/models`` lists (the service serves one)."""
    models = yield RequestSpec("GET", "/v1/models")
    return str(models["data"][0]["id"])


def kcbs_call(prompt: str, beam_width: int, steps: int, *, model: str | None = None,
              **params: Any) -> JsonCall[KcbsResult]:
    """``/v1/kcbs``; ``params`` are the endpoint's other fields (``target``, ``eos``, ...)."""
    if model is None:
        model = yield from default_model()
    body = {"model": model, "prompt": prompt, "beam_width": beam_width, "steps": steps,
            **{k: v for k, v in params.items() if v is not None}}
    reply = yield RequestSpec("POST", "/v1/kcbs", json=body)
    return KcbsResult.from_json(reply)


def tokenize_call(text: str, *, model: str) -> JsonCall[tuple[list[int], int]]:
    """``/v1/tokenize``: the server's token ids for ``text`` and the model's length."""
    reply = yield RequestSpec("POST", "/v1/tokenize", json={"model": model, "prompt": text})
    return list(reply["tokens"]), int(reply["max_model_len"])


def export_call(prompt: str | Sequence[int], compression_top_k: int = 100, *, model: str | None = None,
                **sampling: Any) -> JsonCall[tuple[Header, TopkDocument]]:
    """``/v1/completions`` with ``compression``, binary reply: its header and its one document."""
    if model is None:
        model = yield from default_model()
    body = {"model": model, "prompt": prompt if isinstance(prompt, str) else list(prompt), "compression": True,
            "compression_top_k": compression_top_k, **{k: v for k, v in sampling.items() if v is not None}}
    reply = yield RequestSpec("POST", "/v1/completions", headers={"accept": "application/octet-stream"},
                              json=body, binary_reply=True)
    try:
        header, documents = read_all(io.BytesIO(reply))
    except TopkFormatError as exc:
        raise CascadeError(0, f"the server's export is malformed: {exc}") from None
    if len(documents) != 1:
        raise CascadeError(0, f"expected one document in the export, got {len(documents)}")
    return header, documents[0]


def export_topk_call(prompt: str | Sequence[int], compression_top_k: int = 100, *, model: str | None = None,
                     **sampling: Any) -> JsonCall[TopkDocument]:
    """``/v1/completions`` with ``compression``: every position's processed top-k, as arrays.

    ``sampling`` is the sampling stack the distributions go through (``temperature``, ``top_p``,
    ``top_k``, ``min_p``, ``logit_bias``, ``allowed_token_ids``, ``bad_words``). The reply is the
    binary layout of ``cascade_common.topk_format``: one document, its first record at token index 1.
    """
    _, document = yield from export_call(prompt, compression_top_k, model=model, **sampling)
    return document
