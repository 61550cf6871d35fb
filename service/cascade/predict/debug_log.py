"""Optional per-iteration YAML log of the proposer, one file per request (``DEBUG_PREDICTED_OUTPUTS=1``).

Files go under ``${CASCADE_HOME:-~/.cascade}/log/``; the request id is sanitised so that no id can
name a path outside that folder.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import IO, Any

import yaml

from cascade.home import cascade_home

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 100


def enabled() -> bool:
    return os.environ.get("DEBUG_PREDICTED_OUTPUTS", "").lower() in ("1", "true", "yes", "on")


def log_dir() -> Path:
    return cascade_home() / "log"


def safe_file_name(request_id: str) -> str:
    """A file name that stays inside the log folder whatever the id holds."""
    cleaned = _SAFE.sub("_", request_id).lstrip(".")
    if not cleaned or len(cleaned) > _MAX_NAME or cleaned != request_id:
        digest = hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        cleaned = f"{cleaned[:48]}-{digest}" if cleaned else digest
    return cleaned + ".yaml"


class PredictionDebugLog:
    """Appends one YAML document per proposer iteration."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path = path
        self._handle = handle

    @classmethod
    def open(cls, request_id: str) -> PredictionDebugLog | None:
        """A log for this request when debugging is enabled, else None."""
        if not enabled():
            return None
        directory = log_dir().resolve()
        directory.mkdir(parents=True, exist_ok=True)
        path = (directory / safe_file_name(request_id)).resolve()
        if path.parent != directory:
            return None
        return cls(path, path.open("a", encoding="utf-8"))

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(yaml.safe_dump(record, explicit_start=True, sort_keys=False))
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()
