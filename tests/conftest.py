"""Shared fixtures and the test tiers. The integration service is one real ``cascade serve`` process
per test session (tests/integration/conftest.py).

Every test gets exactly one tier marker from the directory it lives in, so no test file needs a
decorator and a new file is marked by where it is put:

- ``unit``: tests/unit, tests/routes — pure, no engine, no subprocess service (``pytest -m unit``)
- ``engine``: tests/integration — starts a real vLLM engine/service
- ``portability``: tests/portability — subprocess exact-model runs, slow, no vLLM engine
- ``deploy``: tests/deploy — manifests and an installed image
- ``realmodel``: tests/realmodel — a real instruct model (``smollm2-135m-instruct``, fetched once from the
  package index into ``CASCADE_HOME``) served end to end

A test anywhere else fails collection: put it in one of those directories (or add a tier here).
A test marked ``runs_last`` runs after every other one: it checks work the session started in the
background at its beginning (tests/deploy/image_install.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# Subprocesses (the integration service and vLLM's engine processes, the CLI, examples, probes) run
# this checkout's code, as pytest's own ``pythonpath`` does in-process: without this they would
# import whatever checkout the venv's editable install points at (a worktree would test main).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO / "service"), str(REPO / "clients"), *filter(None, [os.environ.get("PYTHONPATH")])])
TIER_OF_DIRECTORY = {"unit": "unit", "routes": "unit", "integration": "engine", "portability": "portability",
                     "deploy": "deploy", "realmodel": "realmodel"}
TIERS = frozenset(TIER_OF_DIRECTORY.values())


def tier_of(path: Path) -> str | None:
    """The tier of a test file at ``path``, or None when it lies outside every tier directory."""
    try:
        parts = Path(path).resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return TIER_OF_DIRECTORY.get(parts[0]) if len(parts) > 1 else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced: list[str] = []
    for item in items:
        tier = tier_of(item.path)
        explicit = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        if tier is None or explicit - {tier}:
            misplaced.append(f"  {item.nodeid}" + (f" (marked {sorted(explicit)}, lives in the {tier} tier)"
                                                   if tier else ""))
            continue
        item.add_marker(getattr(pytest.mark, tier))
    # stable: the ``runs_last`` tests keep their order among themselves
    items.sort(key=lambda item: item.get_closest_marker("runs_last") is not None)
    if misplaced:
        dirs = ", ".join(f"tests/{d} ({t})" for d, t in TIER_OF_DIRECTORY.items())
        raise pytest.UsageError("tests outside a tier directory (every test needs exactly one tier, set by "
                                f"where it lives: {dirs}):\n" + "\n".join(misplaced))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Free disk where the tests write, on the summary's last lines: a CI machine's disk is shared, and a
    nearly full one has failed services' requests in ways that looked like timing."""
    places = {"temporary files": Path(tempfile.gettempdir()), "checkout": REPO}
    free = ", ".join(f"{name} {shutil.disk_usage(path).free / 2**30:.1f} GiB" for name, path in places.items())
    terminalreporter.write_line(f"disk free at the end: {free}")
