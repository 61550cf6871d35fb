"""``streaming.guarded``: the one path from a failure after the 200 header to an error event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from cascade.api.codec_routes import _guarded as codec_guarded
from cascade.api.errors import APIError
from cascade.api.streaming import SSE_DONE, error_event, error_payload, guarded, sse_data, sse_event
from cascade.codec.pipeline import IntegrityError
from cascade.engine.manager import EngineNotReadyError
from cascade_common import sse


async def _events(fail: BaseException | None, closed: list[bool] | None = None) -> AsyncIterator[bytes]:
    try:
        yield sse_data({"n": 1})
        if fail is not None:
            raise fail
        yield sse_data({"n": 2})
    finally:
        if closed is not None:
            closed.append(True)


def _collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    async def run() -> list[bytes]:
        return [item async for item in stream]

    return asyncio.run(run())


def test_a_failure_becomes_the_error_event_then_done() -> None:
    out = _collect(guarded(_events(RuntimeError("secret detail"))))
    assert out == [b'data: {"n":1}\n\n',
                   b'data: {"error":{"message":"Internal server error","type":"server_error","param":null,'
                   b'"code":"internal_error","status":500}}\n\n',
                   b"data: [DONE]\n\n"]
    assert out[1] == sse_data(error_payload(RuntimeError())) == error_event(RuntimeError())


def test_a_success_passes_through_and_ends_with_done_only_when_asked() -> None:
    assert _collect(guarded(_events(None))) == [sse_data({"n": 1}), sse_data({"n": 2}), SSE_DONE]
    assert _collect(guarded(_events(None), done=False)) == [sse_data({"n": 1}), sse_data({"n": 2})]


def test_error_payloads_keep_their_shape_and_status() -> None:
    assert error_payload(APIError(400, "bad n", param="n", code="c")) == {
        "error": {"message": "bad n", "type": "invalid_request_error", "param": "n", "code": "c", "status": 400}}
    assert error_event(EngineNotReadyError("starting")) == sse.error_event(
        503, "starting", code="engine_unavailable", type_="service_unavailable")
    long = error_payload(APIError(400, "x" * 2000, param="k" * 3000))["error"]
    assert len(long["message"]) == 500 and long["message"].endswith("(truncated)")
    assert len(long["param"]) == 200 and long["param"].endswith("(truncated)")


def test_cancellation_is_not_an_error_event() -> None:
    with pytest.raises(asyncio.CancelledError):
        _collect(guarded(_events(asyncio.CancelledError())))


def test_closing_the_guarded_stream_closes_the_inner_one() -> None:
    closed: list[bool] = []

    async def run() -> None:
        stream = guarded(_events(None, closed))
        assert await anext(stream) == sse_data({"n": 1})
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(run())
    assert closed == [True]


def test_codec_streams_end_with_a_named_error_event_and_no_done() -> None:
    """Byte for byte what /compress and /decompress sent before ``guarded``."""
    out = _collect(codec_guarded(_events(IntegrityError("segment 3 failed its checksum"))))
    assert out == [sse_data({"n": 1}),
                   b'event: error\ndata: {"error":{"message":"segment 3 failed its checksum","type":"codec_error",'
                   b'"param":null,"code":"checksum_mismatch","status":422}}\n\n']
    assert _collect(codec_guarded(_events(None))) == [sse_data({"n": 1}), sse_data({"n": 2})]
    payload = error_payload(APIError(413, "too big", code="input_too_large"))
    payload["error"]["type"] = "codec_error"
    assert _collect(codec_guarded(_events(APIError(413, "too big", code="input_too_large"))))[-1] == sse_event(
        "error", payload)
