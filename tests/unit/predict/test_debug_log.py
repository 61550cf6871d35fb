"""The per-request YAML debug log never escapes its folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cascade.predict.debug_log import PredictionDebugLog, safe_file_name


@pytest.mark.parametrize("rid", ["../../etc/passwd", "/abs/path", "a\0b", "x" * 5000, "..", ".", "", "é/ü"])
def test_hostile_request_ids_stay_in_the_log_folder(rid: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = safe_file_name(rid)
    assert "/" not in name and "\0" not in name and not name.startswith(".") and len(name) < 120
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("DEBUG_PREDICTED_OUTPUTS", "1")
    log = PredictionDebugLog.open(rid)
    assert log is not None
    log.write({"cursor": 3})
    log.close()
    assert log.path.parent == (tmp_path / "log").resolve()


def test_log_holds_one_yaml_document_per_iteration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("DEBUG_PREDICTED_OUTPUTS", "1")
    log = PredictionDebugLog.open("req-1")
    assert log is not None
    for i in range(3):
        log.write({"step": i, "draft": [1, 2]})
    log.close()
    docs = list(yaml.safe_load_all(log.path.read_text()))
    assert [d["step"] for d in docs] == [0, 1, 2]


def test_log_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBUG_PREDICTED_OUTPUTS", raising=False)
    assert PredictionDebugLog.open("r") is None
