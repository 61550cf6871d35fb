"""/compress and /decompress through HTTP with the real engine: exact round trips, streaming, errors."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib

import httpx
import psutil
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


def test_non_utf8_bytes_round_trip_through_raw_segments(service: Service) -> None:
    data = b"valid line\n\xff\xfe\x80 not utf-8\n" + bytes(range(256))
    assert _decompress(service, _compress(service, data)).content == data


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


def test_failed_self_test_makes_codec_answer_503(tmp_path_factory: pytest.TempPathFactory) -> None:
    svc = start_service(tmp_path_factory.mktemp("faulty"), ["--no-enable-predictions", "--codec-selftest-fault"])
    try:
        with svc.client() as client:
            r = client.post("/compress", json={"text": "hello"})
            assert r.status_code == 503
            assert "self-test" in r.json()["error"]["message"]
            assert r.headers["retry-after"]
            ok = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
            assert ok.status_code == 200
        children = psutil.Process(svc.process.pid).children(recursive=True)
        assert children, "engines run in child processes"
    finally:
        code = stop_service(svc)
    assert code == 0, "SIGTERM is a clean shutdown"
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"orphan engine processes after shutdown: {alive}"


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
    stopping end-of-sequence token left out, a stop sequence cut off, ``finish_reason`` kept."""
    eos = json.loads((REPO / "models" / "pycoder-23m" / "generation_config.json").read_text())["eos_token_id"]
    prompt = "import os\n"
    cases = {
        "end of sequence": {"max_tokens": 5, "allowed_token_ids": [eos]},
        "stop sequence": {"max_tokens": 24, "temperature": 0, "stop": ["\n", "zzz"]},
        "stop sequence, sampled": {"max_tokens": 32, "temperature": 1.0, "seed": 11, "stop": ["(", ":"]},
        "length": {"max_tokens": 6, "temperature": 0},
    }
    codec = {"precision_bits": 24, "top_k": 16}
    finishes = set()
    with service.client() as client:
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
                assert (choice["text"], choice["finish_reason"]) == (sampled["text"], sampled["finish_reason"]), \
                    (name, stream)
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


def test_containers_are_portable_between_services_with_different_numerics(
        service: Service, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A second service on another instruction set (oneDNN SSE4.1, ATen's default kernels), another
    thread count and bfloat16 engines writes the same containers and opens the first one's, both ways."""
    other = start_service(tmp_path_factory.mktemp("numerics"),
                          ["--no-enable-predictions", "--dtype", "bfloat16", "--codec-threads", "1"],
                          # AVX2 ATen kernels (this host defaults to AVX-512): under ATEN_CPU_CAPABILITY=default
                          # torch inductor cannot build vLLM's compiled logprob ranking, so every logprobs
                          # request (and the start-up export probe) would kill the engine.
                          env_extra={"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "avx2"})
    try:
        for name, text in CROSS_TEXTS.items():
            data = text.encode()
            here = _compress(service, data, lane_tokens=64, lanes=8)
            there = _compress(other, data, lane_tokens=64, lanes=8)
            assert here == there, f"{name}: the two services wrote different containers"
            assert _decompress(other, here).content == data
            assert _decompress(service, there).content == data
    finally:
        stop_service(other)


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
