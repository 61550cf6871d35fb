"""/compress and /decompress through HTTP with the real engine: exact round trips, streaming, errors."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cascade.codec.container import encode_header, parse_container
from cascade_common.sse import parse

from tests.integration.conftest import MODEL, REPO, Service, start_service, stop_service

TEXTS = {
    "python": 'def greet(name):\n    """Say hello."""\n    return f"hello {name}"\n',
    "crlf_tabs_nul": "a\r\nb\tc\x00d\r\n",
    "emoji_combining_rtl": "🎉 café ñ e\u0301 שלום مرحبا 𝔘𝔫𝔦\n",
    "empty": "",
    "long_line": "x = [" + ", ".join(str(i) for i in range(600)) + "]",
}


def _compress(service: Service, data: bytes, **params: str | int) -> bytes:
    with service.client() as client:
        r = client.post("/compress", content=data, params=params, headers={"content-type": "text/plain"})
    assert r.status_code == 200, r.text
    return r.content


def _decompress(service: Service, container: bytes) -> httpx.Response:
    with service.client() as client:
        return client.post("/decompress", content=container, headers={"content-type": "application/octet-stream"})


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_text_round_trips_byte_exactly(service: Service, name: str) -> None:
    data = TEXTS[name].encode("utf-8")
    container = _compress(service, data)
    r = _decompress(service, container)
    assert r.status_code == 200, r.text
    assert r.content == data


def test_the_service_writes_version_4_and_its_escapes_come_back_exactly(service: Service) -> None:
    """At top-k 2 most tokens escape, so nearly every symbol goes through the version-4 escape tables."""
    data = TEXTS["python"].encode("utf-8")
    container = _compress(service, data, top_k=2)
    assert container[:5] == b"CSCZ\x04"
    assert _decompress(service, container).content == data


def test_non_utf8_bytes_round_trip_through_raw_segments_and_come_back_as_bytes(service: Service) -> None:
    data = b"valid line\n\xff\xfe\x80 not utf-8\n" + bytes(range(256))
    reply = _decompress(service, _compress(service, data))
    assert reply.content == data
    assert reply.headers["content-type"] == "application/octet-stream"
    text = _decompress(service, _compress(service, "naïve ✓\n".encode()))
    assert text.headers["content-type"] == "text/plain; charset=utf-8"


def test_code_compresses_well_below_its_size(service: Service) -> None:
    data = (TEXTS["python"] * 10).encode()
    container = _compress(service, data, precision_bits=24, top_k=32, verify="true")
    assert len(container) < len(data) / 3
    assert _decompress(service, container).content == data


def test_json_body_sse_stream_and_json_decompress(service: Service) -> None:
    text = TEXTS["python"]
    with service.client() as client:
        r = client.post("/compress", json={"text": text, "context": "# module utils\n", "precision_bits": 16},
                        headers={"accept": "text/event-stream"})
        assert r.status_code == 200
        events = parse(r.content)
        chunks = [e.data for e in events if e.name == "chunk"]
        assert [c["seq"] for c in chunks] == list(range(len(chunks)))
        done = next(e.data for e in events if e.name == "done")
        container = b"".join(base64.b64decode(c["data"]) for c in chunks)
        assert done["bytes_in"] == len(text.encode()) and done["bytes_out"] == len(container)
        assert done["tokens"] > 0 and done["bits_per_token"] > 0
        back = client.post("/decompress", json={"data": base64.b64encode(container).decode()},
                           headers={"accept": "text/event-stream"})
        events = parse(back.content)
        assert "".join(e.data["text"] for e in events if e.name == "text") == text
        assert next(e.data for e in events if e.name == "done")["verified"] is True


def _fix_header_crc(container: bytes, header_len: int) -> bytes:
    body = container[:header_len - 4]
    return body + struct.pack("<I", zlib.crc32(body)) + container[header_len:]


def _header_len(container: bytes) -> int:
    return len(encode_header(parse_container(container).header))


def test_damaged_containers_get_clear_4xx(service: Service) -> None:
    container = _compress(service, TEXTS["python"].encode())
    flipped = bytearray(container)
    flipped[len(container) // 2] ^= 0x01
    cases = {"truncated": container[:-7], "flipped": bytes(flipped), "garbage": b"hello world",
             "version": container[:4] + b"\x07" + container[5:], "empty": b""}
    for name, damaged in cases.items():
        r = _decompress(service, damaged)
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["message"], name
    other_model = bytearray(container)
    other_model[5:37] = b"\x01" * 32
    r = _decompress(service, _fix_header_crc(bytes(other_model), _header_len(container)))
    assert r.status_code == 409
    assert "fingerprint" in r.json()["error"]["message"]
    with service.client() as client:
        r = client.post("/decompress", json={"data": "%%%not base64"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_base64"
        r = client.post("/compress", content=b"x", headers={"content-type": "image/png"})
        assert r.status_code == 415
        r = client.post("/compress", json={"text": "x", "precision_bits": 12})
        assert r.status_code == 400
        r = client.post("/compress", json={"text": "x", "model": "other"})
        assert r.status_code == 404


def test_concurrent_compress_decompress_and_chat_stay_exact(service: Service) -> None:
    texts = [f"value_{i} = {i} * {i + 1}\nprint(value_{i})\n" for i in range(6)]

    async def main() -> None:
        async with httpx.AsyncClient(base_url=service.base_url, headers=service.headers, timeout=300) as client:
            async def round_trip(text: str) -> bytes:
                c = await client.post("/compress", content=text.encode(), headers={"content-type": "text/plain"})
                d = await client.post("/decompress", content=c.content,
                                      headers={"content-type": "application/octet-stream"})
                return d.content

            async def chat(i: int) -> int:
                r = await client.post("/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 8})
                return r.status_code

            results = await asyncio.gather(*(round_trip(t) for t in texts), *(chat(i) for i in range(10)))
        assert [r for r in results[:6]] == [t.encode() for t in texts]
        assert results[6:] == [200] * 10

    asyncio.run(main())


def test_sampled_generation_replays_exactly_from_its_code(service: Service) -> None:
    body = {"model": MODEL, "prompt": "def main():\n", "max_tokens": 40, "temperature": 1.0, "seed": 3,
            "codec": {"mode": "encode", "precision_bits": 24, "top_k": 16}}
    with service.client() as client:
        encoded = client.post("/v1/completions", json=body).json()
        code = encoded["codec"]
        assert code["tokens"] == encoded["usage"]["completion_tokens"]
        replay = client.post("/v1/completions", json={
            "model": MODEL, "prompt": "def main():\n", "codec": {**code, "mode": "decode"}}).json()
        assert replay["choices"][0]["text"] == encoded["choices"][0]["text"]
        streamed = []
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    streamed += chunk.get("codec_chunks", [])
        assert b"".join(base64.b64decode(c) for c in streamed) == base64.b64decode(code["data"])
        bad = client.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                   "codec": {"mode": "decode", "data": "@@", "tokens": 3}})
        assert bad.status_code == 400


def test_a_replay_shows_the_text_and_finish_reason_the_engine_gave(service: Service) -> None:
    """Decode mode renders the regenerated tokens as the sampling did: special tokens skipped, the
    stopping end-of-sequence token or stop token id left out, a stop sequence cut off, ``finish_reason``
    kept."""
    eos = json.loads((REPO / "models" / "pycoder-23m" / "generation_config.json").read_text())["eos_token_id"]
    prompt = "import os\n"
    cases: dict[str, dict[str, object]] = {
        "end of sequence": {"max_tokens": 5, "allowed_token_ids": [eos]},
        "stop sequence": {"max_tokens": 24, "temperature": 0, "stop": ["\n", "zzz"]},
        "stop sequence, sampled": {"max_tokens": 32, "temperature": 1.0, "seed": 11, "stop": ["(", ":"]},
        "stop sequence kept": {"max_tokens": 24, "temperature": 0, "stop": ["\n", "zzz"],
                               "include_stop_str_in_output": True},
        "length": {"max_tokens": 6, "temperature": 0},
    }
    codec: dict[str, object] = {"precision_bits": 24, "top_k": 16}
    finishes = set()
    with service.client() as client:
        x = client.post("/v1/tokenize", json={"model": MODEL, "prompt": "x"}).json()["tokens"]
        cases["stop token id"] = {"max_tokens": 6, "temperature": 0, "allowed_token_ids": x, "stop_token_ids": x}
        for name, params in cases.items():
            body = {"model": MODEL, "prompt": prompt, **params, "codec": {**codec, "mode": "encode"}}
            made = client.post("/v1/completions", json=body)
            assert made.status_code == 200, (name, made.text)
            sampled = made.json()["choices"][0]
            finishes.add(sampled["finish_reason"])
            for stream in (False, True):
                replay = client.post("/v1/completions", json={**body, "stream": stream, "codec": {
                    **made.json()["codec"], "mode": "decode"}})
                assert replay.status_code == 200, (name, replay.text)
                if stream:
                    chunk = json.loads(next(line[6:] for line in replay.text.splitlines()
                                            if line.startswith("data: {")))
                    choice, verified = chunk["choices"][0], chunk["codec"]["verified"]
                else:
                    choice, verified = replay.json()["choices"][0], replay.json()["codec"]["verified"]
                ending = ("text", "finish_reason", "stop_reason")
                assert [choice[k] for k in ending] == [sampled[k] for k in ending], (name, stream)
                assert verified is True
        assert finishes == {"stop", "length"}
        refused = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "codec": {
            **codec, "mode": "decode", "data": "AAAA", "tokens": 3, "token_ids": [5, 6, 7]}})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "codec.token_ids"


def test_arbitrary_bytes_become_text_and_come_back(service: Service) -> None:
    """Decode mode turns any bytes into model text; coding those tokens again gives the bytes back
    (without trailing zero bytes, so the length travels separately) once enough tokens were drawn."""
    secret = bytes(range(37, 250, 13)) + b"\x01"
    codec = {"top_k": 32, "precision_bits": 24}
    prompt = "# notes\n"
    tokens = 96
    with service.client() as client:
        for _ in range(4):
            decoded = client.post("/v1/completions", json={
                "model": MODEL, "prompt": prompt,
                "codec": {**codec, "mode": "decode", "data": base64.b64encode(secret).decode(), "tokens": tokens}})
            assert decoded.status_code == 200, decoded.text
            ids = decoded.json()["codec"]["token_ids"]
            assert len(ids) == tokens and decoded.json()["choices"][0]["text"]
            encoded = client.post("/v1/completions", json={
                "model": MODEL, "prompt": prompt, "codec": {**codec, "mode": "encode", "token_ids": ids}})
            assert encoded.status_code == 200, encoded.text
            data = base64.b64decode(encoded.json()["codec"]["data"])
            if data == secret:
                break
            assert secret.startswith(data.rstrip(b"\0")[:-1])
            tokens *= 2
        assert data == secret


CROSS_TEXTS = {
    "code": "".join(f"def handler_{i}(event, context):\n    return {{'status': {200 + i}, 'body': event}}\n"
                    for i in range(40)),
    "prose": "The archive is read from standard input and written to the named files. " * 30,
}


STALL_BODY_TIMEOUT = 3


@pytest.fixture(scope="module")
def other_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A second service on another instruction set (oneDNN SSE4.1, ATen's AVX2 kernels), another thread
    count and bfloat16 engines; its body timeout is short, for the stalled uploads."""
    svc = start_service(tmp_path_factory.mktemp("numerics"),
                        ["--no-enable-predictions", "--dtype", "bfloat16", "--codec-threads", "1",
                         "--body-timeout-seconds", str(STALL_BODY_TIMEOUT)],
                        # AVX2 ATen kernels (this host defaults to AVX-512): under ATEN_CPU_CAPABILITY=default
                        # torch inductor cannot build vLLM's compiled logprob ranking, so every logprobs
                        # request (and the start-up export probe) would kill the engine.
                        env_extra={"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "avx2"})
    yield svc
    stop_service(svc)


def test_containers_are_portable_between_services_with_different_numerics(
        service: Service, other_service: Service) -> None:
    """The two services write the same containers and open each other's, both ways."""
    for name, text in CROSS_TEXTS.items():
        data = text.encode()
        here = _compress(service, data, lane_tokens=64, lanes=8)
        there = _compress(other_service, data, lane_tokens=64, lanes=8)
        assert here == there, f"{name}: the two services wrote different containers"
        assert _decompress(other_service, here).content == data
        assert _decompress(service, there).content == data


STALL_TEXT = b"".join(b"def f%d(x):\n    return x + %d\n" % (i, i) for i in range(3000))  # ~90 KB


def _stalled_upload(svc: Service, path: str, sent: bytes, declared: int, accept: str) -> tuple[bytes, float]:
    """POST ``sent`` of a ``declared``-byte body over a raw socket, then stall; the raw reply once the
    server closes the connection, and the seconds that took."""
    host, port = svc.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        started = time.monotonic()
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {svc.api_key}\r\n"
                     f"Content-Type: text/plain\r\nAccept: {accept}\r\nContent-Length: {declared}\r\n\r\n"
                     .encode() + sent)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply, time.monotonic() - started


def _dechunk(body: bytes) -> tuple[bytes, bool]:
    """A chunked body's bytes, and whether it ended with its terminating chunk."""
    out = b""
    while body:
        size_line, sep, rest = body.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return out, True
        out += rest[:size]
        body = rest[size + 2:]
    return out, False


def test_a_stalled_upload_before_the_lane_plan_is_known_gets_a_408(other_service: Service) -> None:
    """Under one segment's worth of text the reply waits for the body: a real 408 ``body_timeout``."""
    reply, seconds = _stalled_upload(other_service, "/compress", STALL_TEXT[:1000], len(STALL_TEXT), "*/*")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert json.loads(body)["error"]["code"] == "body_timeout"
    assert seconds < 60


def test_a_stalled_upload_after_its_header_went_out_ends_in_a_truncated_container(
        other_service: Service, tmp_path: Path) -> None:
    """Past one segment's worth the 200 and the container's header have gone out: the status cannot change,
    so at the body timeout the connection closes with no trailer — a container every reader refuses as
    truncated, the CLI naming why (a stream cannot say more once its status is sent)."""
    sent = STALL_TEXT[:70_000]
    reply, seconds = _stalled_upload(other_service, "/compress", sent, len(STALL_TEXT), "application/octet-stream")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower(), head
    partial, complete = _dechunk(body)
    assert not complete, "the reply must not end as if the container were whole"
    assert partial.startswith(b"CSCZ")
    assert seconds < STALL_BODY_TIMEOUT + len(sent) / 16384 + 60
    from cascade_client import CascadeClient, CascadeError

    with CascadeClient(other_service.base_url, api_key=other_service.api_key, timeout=120) as client, \
            pytest.raises(CascadeError) as caught:
        client.decompress(partial)
    assert caught.value.code == "truncated_container", caught.value
    cut = tmp_path / "cut.cz"
    cut.write_bytes(partial)
    result = subprocess.run([sys.executable, "-m", "cascade_client", "--server", other_service.base_url,
                             "decompress", str(cut), "-o", str(tmp_path / "back")],
                            env={**os.environ, "CASCADE_API_KEY": other_service.api_key}, capture_output=True,
                            timeout=120)
    assert result.returncode == 1 and not (tmp_path / "back").exists()
    assert "truncated" in result.stderr.decode() and "[truncated_container]" in result.stderr.decode(), result.stderr


def test_the_client_names_a_stalled_upload_as_a_body_timeout(other_service: Service) -> None:
    """Over SSE (the client's protocol) the body timeout arrives as an error event the client raises
    as a 408 ``body_timeout`` — not as a short container."""
    from cascade_client import CascadeClient, CascadeError

    release = threading.Event()

    def source() -> Iterator[bytes]:
        yield STALL_TEXT[:70_000]
        release.wait(60)  # stalls until the test is over
        yield STALL_TEXT[70_000:]

    try:
        with CascadeClient(other_service.base_url, api_key=other_service.api_key, timeout=120) as client, \
                pytest.raises(CascadeError) as caught:
            client.compress(source())
    finally:
        release.set()
    assert caught.value.code == "body_timeout" and caught.value.status == 408, caught.value


def _forged_container(header_from: bytes, lanes: int, lane_tokens: int, payload: bytes) -> bytes:
    """A container with valid checksums whose one segment declares ``lanes × lane_tokens`` tokens over
    ``payload`` (the model fingerprint and numerics are copied from a real container)."""
    from cascade.codec.container import KIND_CODED, ContainerWriter, Header

    real = parse_container(header_from).header
    tokens = lanes * lane_tokens
    writer = ContainerWriter(Header(real.fingerprint, real.precision_bits, real.top_k, real.vocab_size,
                                    real.numerics, lane_tokens, real.params))
    original = b"x" * tokens
    return writer.header_bytes() + writer.segment_bytes(KIND_CODED, tokens, original, payload) \
        + writer.trailer_bytes()


def test_a_forged_payload_far_shorter_than_its_tokens_fails_within_a_few_steps(service: Service) -> None:
    """64 lanes × 1,024 tokens over 35 bytes: the decoder runs off the payload within a few batched
    steps (a valid stream is never read more than 23 bytes past its end) and the request is a 422
    naming the segment — not a decode of all 65,536 tokens before the CRC fails."""
    forged = _forged_container(_compress(service, b"x = 1\n"), 64, 1024, bytes(range(101, 136)))
    assert len(forged) < 200
    r = _decompress(service, forged)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "payload_overrun"
    assert "segment 0's payload ends before its tokens" in error["message"]
    assert "damaged or forged" in error["message"]
    decoded = int(error["message"].split(" after ")[1].split(" of ")[0])
    assert decoded < 64 * 16, f"{decoded} tokens decoded: more than 16 steps of 64 lanes"
    with service.client() as client:
        assert client.post("/compress", content=b"still serving\n",
                           headers={"content-type": "text/plain"}).status_code == 200


@pytest.mark.parametrize("data", [b"\0" * 1000, bytes(range(256)) * 4, "ÿ\u0100\u4e00😀".encode() * 60],
                         ids=["nul", "all_bytes", "rare_characters"])
def test_no_input_grows_by_more_than_the_framing(service: Service, data: bytes) -> None:
    container = _compress(service, data)
    parsed = parse_container(container)
    framing = len(_compress(service, b"")) + (1 + 4 + 4) * len(parsed.segments)
    assert len(container) <= len(data) + framing
    assert _decompress(service, container).content == data


def test_a_replay_object_with_its_check_refuses_every_tampering(service: Service) -> None:
    from cascade.codec.sampling_codec import ids_sha256

    prompt = "def main():\n"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 1.0, "seed": 5,
            "codec": {"mode": "encode", "precision_bits": 24, "top_k": 16}}
    with service.client() as client:
        made = client.post("/v1/completions", json=body).json()
        code = made["codec"]
        check = code["check"]
        assert set(check) == {"version", "model", "numerics", "prompt_sha256", "tokens_sha256"}
        assert check["version"] == 1 and check["numerics"] == code["numerics"] and len(check["model"]) == 64

        def replay(codec: dict[str, object], text: str = prompt) -> httpx.Response:
            return client.post("/v1/completions", json={"model": MODEL, "prompt": text,
                                                        "codec": {**codec, "mode": "decode"}})

        good = replay(code)
        assert good.status_code == 200, good.text
        assert good.json()["choices"][0]["text"] == made["choices"][0]["text"]
        assert good.json()["codec"]["verified"] is True
        assert ids_sha256(good.json()["codec"]["token_ids"]) == check["tokens_sha256"]
        data = base64.b64decode(code["data"])
        flipped = bytes([data[0] ^ 0x01]) + data[1:]
        cases: dict[str, tuple[httpx.Response, int, str]] = {
            "other prompt": (replay(code, "def other():\n"), 422, "replay_mismatch"),
            "flipped byte": (replay({**code, "data": base64.b64encode(flipped).decode()}), 422, "replay_mismatch"),
            "truncated data": (replay({**code, "data": base64.b64encode(data[:-1]).decode()}), 422,
                               "replay_mismatch"),
            "empty data": (replay({**code, "data": ""}), 422, "replay_mismatch"),
            "last byte changed": (replay({**code, "data": base64.b64encode(data[:-1] + bytes([data[-1] ^ 0x01]))
                                          .decode()}), 422, "replay_mismatch"),
            "byte appended": (replay({**code, "data": base64.b64encode(data + b"\x00").decode()}), 422,
                              "replay_mismatch"),
            "fewer tokens": (replay({**code, "tokens": code["tokens"] - 1}), 422, "replay_mismatch"),
            "other top_k": (replay({**code, "top_k": 17}), 422, "replay_mismatch"),
            "other numerics": (replay({**code, "check": {**check, "numerics": "exact-llama-2"}}), 409,
                               "numerics_mismatch"),
            "other model": (replay({**code, "check": {**check, "model": "0" * 64}}), 409, "model_mismatch"),
            "malformed check": (replay({**code, "check": {**check, "tokens_sha256": "xyz"}}), 400, ""),
        }
        for name, (r, status, error_code) in cases.items():
            assert r.status_code == status, (name, r.text)
            if error_code:
                assert r.json()["error"]["code"] == error_code, name
        unchecked = {k: v for k, v in code.items() if k != "check"}
        assert replay({**unchecked, "data": ""}).status_code == 200, "without a check decode takes any bytes"
        forced = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "codec": {
            "mode": "encode", "precision_bits": 24, "top_k": 16, "token_ids": good.json()["codec"]["token_ids"]}})
        assert forced.json()["codec"]["check"] == check
        assert forced.json()["codec"]["data"] == code["data"]
