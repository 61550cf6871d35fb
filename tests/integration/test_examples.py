"""Every script in examples/ runs against the live service (found through CASCADE_SERVER/CASCADE_API_KEY)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import REPO, Service

EXAMPLES = REPO / "examples"


def _run(service: Service, script: str, *args: str, cwd: Path = REPO) -> tuple[str, dict[str, str]]:
    """Run an example; returns its output before the final ``--- k=v ...`` line, and that line's fields."""
    env = {**os.environ, "CASCADE_SERVER": service.base_url, "CASCADE_API_KEY": service.api_key}
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                            env=env, cwd=cwd, timeout=300)
    assert result.returncode == 0, result.stderr
    body, _, last = result.stdout.rstrip("\n").rpartition("\n")
    return body, dict(re.findall(r"(\w+)=(\S+)", last))


def test_every_example_is_covered() -> None:
    scripts = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    tested = {"predicted_edit.py", "streaming_chat.py", "compress_file.py", "token_surprisal.py"}
    assert scripts == tested, f"examples without a test here (or tests without an example): {scripts ^ tested}"


def test_predicted_edit_drafts_tokens_and_changes_no_text(service: Service) -> None:
    """The default model never saw chat data, so whether its reply follows the draft is luck; what must
    hold is that the draft changed no text, that usage is counted from the engine, and that a reply
    repeating a line of the draft had the draft proposed (the proposer drafts once the output follows
    the prediction, not while it writes something else)."""
    with_draft, fields = _run(service, "predicted_edit.py")
    without_draft, plain = _run(service, "predicted_edit.py", "--no-prediction")
    assert with_draft == without_draft and with_draft.strip()  # greedy: the draft only changes speed
    source = (REPO / "examples" / "predicted_edit.py").read_text()
    draft = source.split("CODE = '''", 1)[1].split("'''", 1)[0]
    if any(len(line.strip()) >= 12 and line in with_draft for line in draft.splitlines()):
        assert int(fields["accepted_prediction_tokens"]) + int(fields["rejected_prediction_tokens"]) > 0
    assert int(fields["accepted_prediction_tokens"]) <= int(fields["completion_tokens"])
    assert plain["accepted_prediction_tokens"] in ("0", "None")


def test_streaming_chat_prints_deltas_and_usage(service: Service) -> None:
    text, fields = _run(service, "streaming_chat.py", "def add(a, b):", "--max-tokens", "12")
    assert text.strip() and int(fields["chunks"]) >= 1
    assert 1 <= int(fields["completion_tokens"]) <= 12


def test_compress_file_round_trips_sync_and_async(service: Service, tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_bytes((REPO / "examples" / "streaming_chat.py").read_bytes()[:500])
    for mode in ((), ("--async",)):
        _, fields = _run(service, "compress_file.py", str(source), *mode, cwd=tmp_path)
        assert fields["identical"] == "True"
        container = (tmp_path / "sample.py.cz").read_bytes()
        assert container.startswith(b"CSCZ") and len(container) < source.stat().st_size


def test_token_surprisal_reads_every_position_of_the_export(service: Service, tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text("import os\n\n\ndef main():\n    print(os.getcwd())\n")
    listing, fields = _run(service, "token_surprisal.py", str(source), "--top-k", "5", "--show", "3")
    assert len(listing.splitlines()) == 3 and "model expected" in listing
    assert 0 < int(fields["in_top_k"]) <= int(fields["positions"]) and float(fields["bits_per_token"]) > 0
