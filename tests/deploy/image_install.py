"""The CPU image's install steps (deploy/Dockerfile.cpu) into a temporary folder and a new venv, run in
the background while the rest of the session's tests run (test_image_install.py checks the result)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The venv holds torch and vLLM (~3.7 GB) and pip unpacks wheels beside it.
NEEDED_FREE_BYTES = 6 * 2**30


def _copy_like_the_image(target: Path) -> None:
    """The project files the CPU image copies into its WORKDIR (both stages; not ``--from`` copies,
    nor the build's extras under absolute paths: CA certificates, extra wheels)."""
    text = (REPO / "deploy/Dockerfile.cpu").read_text()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, dest = line.split()
        if line.startswith("--") or dest.startswith("/"):
            continue
        for source in sources:
            path, into = REPO / source, target / dest
            if dest.endswith("/"):
                into = into / path.name
            into.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, into, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            else:
                shutil.copy2(path, into)


def _remove_finished_sessions_venvs(folder: Path) -> None:
    """Delete the venvs this install left in earlier pytest sessions' numbered folders (pytest keeps the
    last three): several GB each, they filled a CI machine's disk. A session still running holds its
    ``.lock`` file, and its folder is left alone."""
    session, name = folder.parent, re.sub(r"\d+$", "", folder.name)
    for earlier in session.parent.glob("pytest-*"):
        if earlier != session and not (earlier / ".lock").exists():
            for leftover in earlier.glob(f"{name}*/venv"):
                shutil.rmtree(leftover, ignore_errors=True)


class ImageInstall:
    """The image's install steps, started in the background by the session's first deploy test and
    checked by its last test (``runs_last``).

    pip spends ~3 minutes unpacking torch and vLLM, mostly on one core, and the engine tests leave a
    core to spare (vLLM binds an engine's worker to one core and reserves the next): at nice 19 beside
    them, the install costs CI little of its time."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.app, self.venv = folder, folder / "opt-cascade", folder / "venv"
        self.skip_reason: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        _remove_finished_sessions_venvs(folder)
        free = shutil.disk_usage(folder).free
        if free < NEEDED_FREE_BYTES:
            self.skip_reason = (f"a venv with torch and vLLM needs {NEEDED_FREE_BYTES / 2**30:.0f} GiB free; "
                                f"{folder} has {free / 2**30:.1f} GiB")
            return
        self.app.mkdir()
        _copy_like_the_image(self.app)
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
        env = {**outside_env(), "CASCADE_FLAVOUR": "cpu", "PYTHON": str(self.python),
               "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
        with (folder / "install.out").open("wb") as out, (folder / "install.err").open("wb") as err:
            self.process = subprocess.Popen(["sh", "deploy/install.sh"], cwd=self.app, env=env, stdout=out,
                                            stderr=err, start_new_session=True, preexec_fn=lambda: os.nice(19))

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def result(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Wait for the install and return what it printed."""
        assert self.process is not None
        code = self.process.wait(timeout)
        return subprocess.CompletedProcess(self.process.args, code, (self.folder / "install.out").read_text(),
                                           (self.folder / "install.err").read_text())

    def remove(self) -> None:
        """Stop the install if it still runs and free its disk (the tests after it need it)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.venv, ignore_errors=True)


def outside_env() -> dict[str, str]:
    """This process's environment without tests/conftest.py's PYTHONPATH (this checkout's sources):
    the installed package must serve alone."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
