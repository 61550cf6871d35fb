"""The sync client and the CLI against the live service: file and socket sinks, stdin/stdout, errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cascade_client import (
    AuthenticationError,
    BadRequestError,
    CascadeClient,
    CascadeConnectionError,
    CascadeError,
    DecompressStats,
    RetryPolicy,
)

from tests.integration.conftest import MODEL, REPO, Service

TEXT = b"import sys\n\n\ndef main(argv):\n    return len(argv)\n\n\nif __name__ == '__main__':\n    main(sys.argv)\n"


def test_client_streams_compress_and_decompress_through_file_sinks(service: Service, tmp_path: Path) -> None:
    source, packed, restored = tmp_path / "in.py", tmp_path / "in.py.cz", tmp_path / "out.py"
    source.write_bytes(TEXT)
    with CascadeClient(service.base_url, service.api_key) as client:
        with source.open("rb") as src, packed.open("wb") as dst:
            stats = client.compress_to(dst, src, precision_bits=24)
        assert stats.bytes_in == len(TEXT) and stats.bytes_out == packed.stat().st_size
        assert stats.tokens > 0 and 0 < stats.bits_per_token < 8 and stats.segments == 1
        with packed.open("rb") as src, restored.open("wb") as dst:
            result = client.decompress_to(dst, src)
    assert result == DecompressStats(bytes=len(TEXT), segments=result.segments, verified=True)
    assert restored.read_bytes() == TEXT


def test_client_writes_chunks_to_a_socket_sink(service: Service) -> None:
    """A byte-sink client: the container goes straight into a socket as each chunk arrives."""
    ours, theirs = socket.socketpair()
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.extend(iter(lambda: theirs.recv(65536), b"")))
    reader.start()
    with CascadeClient(service.base_url, service.api_key) as client:
        stats = client.compress_to(ours, TEXT)
        ours.close()
        reader.join(30)
        theirs.close()
        container = b"".join(received)
        assert len(container) == stats.bytes_out and container.startswith(b"CSCZ")
        assert client.decompress(container) == TEXT


def test_client_raises_typed_errors_with_the_server_message(service: Service) -> None:
    with CascadeClient(service.base_url, service.api_key) as client:
        with pytest.raises(BadRequestError) as info:
            client.decompress(b"CSCZ\x01 definitely not a container")
        assert "container" in info.value.message and info.value.status == 400
        with pytest.raises(BadRequestError) as beam:
            client.kcbs("x", beam_width=99, steps=2)
        assert beam.value.param == "beam_width" and beam.value.type == "invalid_request_error"
    with CascadeClient(service.base_url, "wrong-key") as client, pytest.raises(AuthenticationError) as auth:
        client.compress(b"x")
    assert auth.value.status == 401 and isinstance(auth.value, CascadeError)


def test_client_kcbs_returns_typed_result(service: Service) -> None:
    with CascadeClient(service.base_url, service.api_key) as client:
        result = client.kcbs("import os\n\ndef ", beam_width=3, steps=4, target="main")
    assert len(result.sequences) == 3 and all(len(s.token_ids) == 4 for s in result.sequences)
    assert 0 < result.captured_probability <= 1 and result.target_match is not None
    assert result.raw["model"] == MODEL


def _cli(service: Service | None, *args: str, stdin: bytes = b"", cwd: Path = REPO,
         **env: str) -> subprocess.CompletedProcess[bytes]:
    known = {} if service is None else {"CASCADE_SERVER": service.base_url, "CASCADE_API_KEY": service.api_key}
    environ = {**os.environ, **known, **env}
    return subprocess.run([sys.executable, "-m", "cascade", *args], input=stdin, capture_output=True, env=environ,
                          cwd=cwd, timeout=300)


def _one_error_line(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cascade: error: "), lines
    return lines[0]


def test_cli_compresses_stdin_to_stdout_and_back(service: Service) -> None:
    packed = _cli(service, "compress", "-", "-o", "-", stdin=TEXT)
    assert packed.returncode == 0, packed.stderr
    assert packed.stdout.startswith(b"CSCZ")
    assert b"bits/byte" in packed.stderr and b"\r" not in packed.stderr  # no bars: stderr is not a TTY
    restored = _cli(service, "decompress", "-", stdin=packed.stdout)  # '-' in: stdout out by default
    assert restored.returncode == 0 and restored.stdout == TEXT


def test_cli_files_default_names_progress_and_options_after_the_command(service: Service, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_bytes(TEXT)
    packed = _cli(None, "compress", "a.py", "--progress", "--precision-bits", "24", "--server", service.base_url,
                  "--api-key", service.api_key, cwd=tmp_path)
    assert packed.returncode == 0, packed.stderr
    assert b"upload" in packed.stderr and b"container" in packed.stderr  # the forced tqdm bars
    (tmp_path / "a.py").rename(tmp_path / "orig.py")
    restored = _cli(service, "--quiet", "decompress", "a.py.cz", cwd=tmp_path)
    assert restored.returncode == 0 and restored.stderr == b""
    assert (tmp_path / "a.py").read_bytes() == TEXT


def test_cli_kcbs_prints_json(service: Service) -> None:
    result = _cli(service, "kcbs", "for i in range(", "-k", "2", "-T", "3")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["object"] == "kcbs.result"


def test_cli_failure_is_one_line_and_nonzero(service: Service, tmp_path: Path) -> None:
    result = _cli(service, "decompress", "-", "-o", "-", stdin=b"garbage")
    assert "(HTTP 400)" in _one_error_line(result) and result.stdout == b""
    # A failed run leaves no partial output file behind.
    (tmp_path / "bad.cz").write_bytes(b"CSCZ garbage")
    _one_error_line(_cli(service, "decompress", "bad.cz", "-o", "out.py", cwd=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.cz"]
    assert "(HTTP 401)" in _one_error_line(_cli(service, "compress", "-", stdin=TEXT, CASCADE_API_KEY="nope"))
    assert "No such file" in _one_error_line(_cli(service, "compress", str(tmp_path / "missing.py")))
    assert "(HTTP 400)" in _one_error_line(_cli(service, "kcbs", "x", "-k", "99"))


def test_cli_and_client_report_an_unreachable_server(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    refused = _one_error_line(_cli(None, "--server", url, "--retries", "1", "compress", "-", stdin=TEXT))
    assert "cannot reach" in refused and "gave up after 2 attempts" in refused
    with CascadeClient(url, retry=RetryPolicy.none()) as client, pytest.raises(CascadeConnectionError):
        client.compress(TEXT)
    usage = _cli(None, "compress")
    assert usage.returncode == 2 and b"usage:" in usage.stderr


def test_client_receives_container_chunks_while_still_uploading(service: Service) -> None:
    """The sync client is full duplex too: later input is only produced after a segment came back."""
    records = threading.Event()
    parts: list[bytes] = []

    class Sink:
        def write(self, data: bytes) -> int:
            parts.append(data)
            if len(parts) >= 2:  # the header, then a segment's record
                records.set()
            return len(data)

    def source() -> Iterator[bytes]:
        yield TEXT * 4
        assert records.wait(120), "no container chunk arrived while the upload was still open"
        yield TEXT * 2

    with CascadeClient(service.base_url, service.api_key) as client:
        stats = client.compress_to(Sink(), source(), lane_tokens=32, lanes=1)
        assert stats.segments >= 2 and client.decompress(b"".join(parts)) == TEXT * 6
