"""Where the CLI's ``-o PATH`` writes: files are replaced whole on success, anything else is written into."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from cascade_client.cli import _output


def _write(path: str, data: bytes) -> None:
    with _output(path) as handle:
        handle.write(data)


def test_a_fifo_is_written_into_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    _write(str(fifo), b"through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_symlink_stays_and_its_target_gets_the_output(tmp_path: Path) -> None:
    target, link = tmp_path / "real.cz", tmp_path / "link.cz"
    target.write_bytes(b"old")
    link.symlink_to(target)
    _write(str(link), b"new")
    assert link.is_symlink() and target.read_bytes() == b"new"


def test_a_replaced_file_keeps_its_permissions_and_no_partial_file_is_left(tmp_path: Path) -> None:
    out = tmp_path / "out.cz"
    out.write_bytes(b"old")
    out.chmod(0o640)
    _write(str(out), b"new")
    assert out.read_bytes() == b"new" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.cz"]


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "out.cz"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError), _output(str(out)) as handle:
        handle.write(b"half")
        raise RuntimeError("the server went away")
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.cz"]


@pytest.mark.parametrize("where", ["a directory", "a missing directory"])
def test_an_impossible_path_is_named_as_given(tmp_path: Path, where: str) -> None:
    path = str(tmp_path) if where == "a directory" else str(tmp_path / "missing" / "out.cz")
    with pytest.raises(OSError) as raised:
        _write(path, b"x")
    assert raised.value.filename == path


@pytest.mark.parametrize("reply", [b"<html>not json</html>", b'{"unexpected": true}'])
def test_a_reply_the_protocol_does_not_describe_is_one_error_line_not_a_traceback(
        reply: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    import http.server

    from cascade_client.cli import main

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = main(["--server", f"http://127.0.0.1:{server.server_address[1]}", "--retries", "0",
                     "kcbs", "x", "--beam-width", "2", "--steps", "2"])
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("cascade: error:") and "Traceback" not in err, err


@pytest.mark.parametrize("args", [["--server", "localhost:8000"], ["--server", "ftp://host"], ["--timeout", "0"],
                                  ["--timeout", "nan"], ["--retries", "-1"], ["--retry-budget", "-5"],
                                  ["--piece-bytes", "4096"]])
def test_options_that_cannot_work_are_usage_errors(args: list[str]) -> None:
    from cascade_client.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["compress", "-", "-o", "-", *args])
    assert exited.value.code == 2


@pytest.mark.parametrize(("sink", "source"), [(None, "text to compress"), (None, Path("in.py")), ("out.cz", b"x")])
def test_a_path_or_str_given_as_source_or_sink_is_a_clear_type_error_before_any_request(
        sink: object, source: object) -> None:
    import io

    from cascade_client import CascadeClient

    with CascadeClient("http://127.0.0.1:9") as client, pytest.raises(TypeError, match="open"):
        client.compress_to(io.BytesIO() if sink is None else sink, source)  # type: ignore[arg-type]


def test_sigterm_mid_request_leaves_no_partial_output_file(tmp_path: Path) -> None:
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as silent:  # accepts the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        source = tmp_path / "in.py"
        source.write_bytes(b"x = 1\n")
        cli = subprocess.Popen([sys.executable, "-m", "cascade_client", "--server",
                                f"http://127.0.0.1:{silent.getsockname()[1]}", "-q", "compress", str(source),
                                "-o", str(tmp_path / "out.cz")], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while not any(p.name.endswith(".part") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=20)
    assert cli.returncode == 143, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.py"]


@pytest.mark.parametrize(("command", "given", "derived"), [("compress", "notes.txt", "notes.txt.cz"),
                                                           ("decompress", "notes.txt.cz", "notes.txt")])
def test_a_derived_output_name_never_replaces_an_existing_file_without_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, given: str, derived: str) -> None:
    from cascade_client.cli import _default_output, main

    (tmp_path / given).write_bytes(b"input")
    (tmp_path / derived).write_bytes(b"keep me")
    # Refused before any request: nothing listens on port 9.
    code = main(["--server", "http://127.0.0.1:9", "--retries", "0", command, str(tmp_path / given)])
    err = capsys.readouterr().err
    assert code == 1 and "already exists" in err and "-f" in err, err
    assert (tmp_path / derived).read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([given, derived])
    assert _default_output(str(tmp_path / given), command, force=True) == str(tmp_path / derived)
