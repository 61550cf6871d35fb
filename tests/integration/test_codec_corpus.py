"""No container orphaned: every codec object in tests/fixtures/codec_v1 (written by release ddd10e1,
container format 3, numerics ``exact-llama-1``) still decodes byte for byte over HTTP."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cascade_common.sse import parse

from tests.integration.conftest import MODEL, Service

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "codec_v1"
MANIFEST: dict[str, Any] = json.loads((CORPUS / "manifest.json").read_text())


def test_the_corpus_covers_every_precision_and_both_object_kinds() -> None:
    precisions = {params.get("precision_bits", 32) for params in MANIFEST["containers"].values()}
    assert precisions == {16, 24, 32}
    assert len(MANIFEST["containers"]) >= 12 and len(MANIFEST["replays"]) >= 5
    assert sum(p.stat().st_size for p in CORPUS.rglob("*")) < 200_000


@pytest.mark.parametrize("name", sorted(MANIFEST["containers"]))
def test_release_containers_decode_byte_for_byte(service: Service, name: str) -> None:
    container = (CORPUS / "containers" / f"{name}.cz").read_bytes()
    original = (CORPUS / "containers" / f"{name}.orig").read_bytes()
    with service.client() as client:
        raw = client.post("/decompress", content=container, headers={"content-type": "application/octet-stream"})
        assert raw.status_code == 200, raw.text
        assert raw.content == original
        sse = client.post("/decompress", json={"data": base64.b64encode(container).decode()},
                          headers={"accept": "text/event-stream"})
    events = parse(sse.content)
    streamed = b"".join(e.data["text"].encode() if "text" in e.data else base64.b64decode(e.data["data_b64"])
                        for e in events if e.name == "text")
    assert streamed == original
    assert next(e.data for e in events if e.name == "done")["verified"] is True


@pytest.mark.parametrize("name", sorted(MANIFEST["replays"]))
def test_release_replay_objects_regenerate_their_tokens(service: Service, name: str) -> None:
    replay = MANIFEST["replays"][name]
    with service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": replay["request"]["prompt"],
                                                 "codec": {**replay["codec"], "mode": "decode"}})
    assert r.status_code == 200, r.text
    assert r.json()["codec"]["token_ids"] == replay["token_ids"]
    assert r.json()["choices"][0]["text"] == replay["text"]
