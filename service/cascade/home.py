"""Cascade's own directory on a host: ``$CASCADE_HOME``, or ``~/.cascade``. One rule for every file the
service keeps there (fetched models, prediction debug logs), so they never end up in two places."""

from __future__ import annotations

import os
from pathlib import Path


def cascade_home() -> Path:
    return Path(os.environ.get("CASCADE_HOME") or Path.home() / ".cascade").expanduser()
