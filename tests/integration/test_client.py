"""The Python client and the CLI against the live service: streaming file sinks, stdin/stdout, errors."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cascade_client import CascadeClient, CascadeError

from tests.integration.conftest import REPO, Service

TEXT = b"import sys\n\n\ndef main(argv):\n    return len(argv)\n\n\nif __name__ == '__main__':\n    main(sys.argv)\n"


def test_client_streams_compress_and_decompress_through_file_sinks(service: Service, tmp_path: Path) -> None:
    source, packed, restored = tmp_path / "in.py", tmp_path / "in.py.cz", tmp_path / "out.py"
    source.write_bytes(TEXT)
    with CascadeClient(service.base_url, service.api_key) as client:
        with source.open("rb") as src, packed.open("wb") as dst:
            stats = client.compress_to(dst, src, precision_bits=24)
        assert stats.bytes_in == len(TEXT) and stats.bytes_out == packed.stat().st_size
        with packed.open("rb") as src, restored.open("wb") as dst:
            assert client.decompress_to(dst, src) == len(TEXT)
    assert restored.read_bytes() == TEXT


def test_client_raises_typed_errors_with_the_server_message(service: Service) -> None:
    with CascadeClient(service.base_url, service.api_key) as client:
        with pytest.raises(CascadeError) as info:
            client.decompress(b"CSCZ\x01 definitely not a container")
        assert "container" in info.value.message
        with pytest.raises(CascadeError) as info:
            client.kcbs("x", beam_width=99, steps=2)
        assert info.value.status == 400
    with CascadeClient(service.base_url, "wrong-key") as client, pytest.raises(CascadeError) as info:
        client.compress(b"x")
    assert info.value.status == 401


def _cli(service: Service, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CASCADE_SERVER": service.base_url, "CASCADE_API_KEY": service.api_key}
    return subprocess.run([sys.executable, "-m", "cascade", *args], input=stdin, capture_output=True, env=env,
                          cwd=REPO, timeout=300)


def test_cli_compresses_stdin_to_stdout_and_back(service: Service) -> None:
    packed = _cli(service, "compress", "-", "-o", "-", stdin=TEXT)
    assert packed.returncode == 0, packed.stderr
    assert packed.stdout.startswith(b"CSCZ")
    restored = _cli(service, "decompress", "-", "-o", "-", stdin=packed.stdout)
    assert restored.returncode == 0 and restored.stdout == TEXT


def test_cli_failure_is_one_line_and_nonzero(service: Service) -> None:
    result = _cli(service, "decompress", "-", "-o", "-", stdin=b"garbage")
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cascade: error:")
    assert io.BytesIO(result.stdout).read() == b""
