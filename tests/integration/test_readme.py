"""The README's curl (and CLI) commands work as written, run against the live service.

Blocks marked ``<!-- readme-test: NAME -->`` right above a ```bash fence are run in README order,
with bash, in one directory holding ``file.py``, after two substitutions: the service's address
for ``localhost:8000``/``127.0.0.1:8000`` and the test API key as an ``authorization`` header on
every curl (the CLI finds both in ``CASCADE_SERVER``/``CASCADE_API_KEY``, where a user's default
``127.0.0.1:8000`` would be). Each block's output is checked by the function registered under its name, and every
marked block must have one (so a new example cannot go untested, nor a check outlive its example).
"""

from __future__ import annotations

import ast
import base64
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import MODEL, REPO, Service

MARKED = re.compile(r"<!-- readme-test: ([\w-]+) -->\n```bash\n(.*?)\n```", re.S)
FILE_PY = "def greet(name):\n    return f'hello {name}'\n\n\nfor who in ('a', 'b'):\n    print(greet(who))\n"


def readme_blocks() -> list[tuple[str, str]]:
    return MARKED.findall((REPO / "README.md").read_text())


def _localize(script: str, service: Service) -> str:
    address = service.base_url.removeprefix("http://")
    script = re.sub(r"(localhost|127\.0\.0\.1):8000", address, script)
    return re.sub(r"^curl ", f"curl -H 'authorization: Bearer {service.api_key}' ", script, flags=re.M)


def _shown_output(name: str) -> str:
    """The output a block's ``#`` comment lines show, joined without the comment markers."""
    script = dict(readme_blocks())[name]
    return "".join(line.lstrip()[1:].strip() for line in script.splitlines() if line.lstrip().startswith("#"))


def _json(out: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(out)
    return value


def _sse(out: str) -> list[tuple[str, Any]]:
    events, name = [], "message"
    for line in out.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, line[6:] if line == "data: [DONE]" else json.loads(line[6:])))
            name = "message"
    return events


def check_completion(out: str, _: Path) -> None:
    body = _json(out)
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert isinstance(body["choices"][0]["text"], str) and body["usage"]["completion_tokens"] == 20


def check_chat(out: str, _: Path) -> None:
    body = _json(out)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant" and body["choices"][0]["message"]["content"]


def check_chat_stream(out: str, _: Path) -> None:
    events = _sse(out)
    assert events[-1] == ("message", "[DONE]")
    chunks = [data for _, data in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def check_responses(out: str, _: Path) -> None:
    body = _json(out)
    message = body["output"][0]
    assert body["object"] == "response" and body["id"].startswith("resp_") and message["role"] == "assistant"
    assert message["content"][0]["type"] == "output_text" and body["usage"]["output_tokens"] <= 16


def check_chat_prediction(out: str, _: Path) -> None:
    details = _json(out)["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] >= 0 and details["rejected_prediction_tokens"] >= 0


def check_compress_file(_: str, cwd: Path) -> None:
    assert (cwd / "file.py.cz").read_bytes().startswith(b"CSCZ")
    assert (cwd / "file.py.out").read_bytes() == FILE_PY.encode()  # `cmp` already passed; belt and braces


def check_compress_sse(out: str, cwd: Path) -> None:
    events = _sse(out)
    chunks = [data for name, data in events if name == "chunk"]
    assert [c["seq"] for c in chunks] == list(range(len(chunks)))
    container = b"".join(base64.b64decode(c["data"]) for c in chunks)
    done = [data for name, data in events if name == "done"]
    assert container.startswith(b"CSCZ") and done[0]["bytes_in"] == len(FILE_PY)
    assert done[0]["bytes_out"] == len(container)
    assert "".join(data["text"] for name, data in events if name == "text") == FILE_PY
    assert done[1] == {"segments": done[1]["segments"], "bytes": len(FILE_PY), "verified": True}


def check_cli(out: str, cwd: Path) -> None:
    assert (cwd / "file.py.back").read_text() == FILE_PY
    assert _json(out)["object"] == "kcbs.result"


def check_kcbs(out: str, _: Path) -> None:
    body = _json(out)
    assert body["object"] == "kcbs.result" and len(body["sequences"]) == 4
    assert all(len(s["token_ids"]) == 10 for s in body["sequences"])
    assert set(body["target_match"]) >= {"exact", "near_verbatim_probability", "matches"}


def check_export_json(out: str, _: Path) -> None:
    body = _json(out)
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["distribution_type"] == "topk-renorm" and logprobs["top_k"] == 5
    assert len(logprobs["content"]) == body["usage"]["prompt_tokens"] - 1 and body["usage"]["completion_tokens"] == 0
    for position in logprobs["content"]:
        assert abs(sum(math.exp(c["logprob"]) for c in position["top_logprobs"]) - 1) < 1e-5
    first = logprobs["content"][0]
    best = first["top_logprobs"][0]
    shown = _shown_output("export-json")
    for fragment in (f'"prompt_tokens":{body["usage"]["prompt_tokens"]}',
                     f'{{"token":{json.dumps(first["token"])},"token_id":{first["token_id"]},"logprob":'
                     f'{json.dumps(first["logprob"] if first["logprob"] is None else round(first["logprob"], 2))}',
                     f'{{"token":{json.dumps(best["token"])},"token_id":{best["token_id"]},"logprob":{best["logprob"]:.2f}'):
        assert fragment in shown, f"the README shows other values than the service returns: {fragment}"


def check_export_cli(out: str, _: Path) -> None:
    k, docs = out.strip().split(" ", 1)
    [(name, start, count)] = ast.literal_eval(docs)
    assert int(k) == 8 and name == "file.py" and start == 1 and count > 10


CHECKS: dict[str, Callable[[str, Path], None]] = {
    "completion": check_completion, "chat": check_chat, "chat-stream": check_chat_stream, "responses": check_responses,
    "chat-prediction": check_chat_prediction, "compress-file": check_compress_file,
    "compress-sse": check_compress_sse, "cli": check_cli, "export-json": check_export_json,
    "export-cli": check_export_cli, "kcbs": check_kcbs,
}


def test_every_marked_block_has_a_check_and_the_readme_covers_the_surface() -> None:
    names = [name for name, _ in readme_blocks()]
    assert sorted(names) == sorted(CHECKS) and len(set(names)) == len(names)
    scripts = "\n".join(script for _, script in readme_blocks())
    for route in ("/v1/chat/completions", "/compress", "/decompress", "/v1/kcbs", '"prediction"',
                  '"compression": true', "export-topk", "text/event-stream", " -o "):
        assert route in scripts, route


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("readme")
    (path / "file.py").write_text(FILE_PY)
    return path


@pytest.mark.parametrize("name", [name for name, _ in readme_blocks()])
def test_readme_block_runs(service: Service, workdir: Path, name: str) -> None:
    script = dict(readme_blocks())[name]
    env = {**os.environ, "CASCADE_API_KEY": service.api_key, "CASCADE_SERVER": service.base_url,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", _localize(script, service)], capture_output=True,
                            text=True, cwd=workdir, env=env, timeout=300)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    CHECKS[name](result.stdout, workdir)
