"""Teacher-forced top-k export (``"compression": true``) against the real engine, checked with transformers."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest
import torch
from cascade_client.topk_document import read_all

from tests.integration.conftest import MODEL, REPO, Service, wait_until_idle

TEXT = ("import os\n\n\ndef read_lines(path):\n    with open(path) as handle:\n"
        "        return [line.rstrip() for line in handle]\n")


def export(service: Service, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": TEXT, "compression": True, "compression_top_k": 20, **fields}
    with service.client() as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.fixture(scope="module")
def hf_logits() -> tuple[list[int], torch.Tensor]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = REPO / "models" / "pycoder-23m"
    ids = AutoTokenizer.from_pretrained(path).encode(TEXT, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return ids, model(torch.tensor([ids])).logits[0].float()


def reference(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
              k: int) -> dict[int, float]:
    """The sampler's distribution computed independently: temperature, top-k, top-p, renormalised top-k."""
    scaled = logits / temperature
    probs = scaled.softmax(-1)
    order = torch.argsort(probs, descending=True)
    keep = order[:top_k] if top_k else order
    kept = probs[keep] / probs[keep].sum()
    if top_p is not None:
        before = torch.cumsum(kept, 0) - kept
        keep = keep[before < top_p]
    keep = keep[:k]
    total = probs[keep].sum()
    return {int(t): math.log(float(probs[t] / total)) for t in keep}


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, None, None), (0.7, 40, None), (1.3, None, 0.9),
                                                              (0.8, 50, 0.95)])
def test_processed_distribution_matches_transformers(service: Service, hf_logits: tuple[list[int], torch.Tensor],
                                                     temperature: float, top_k: int | None,
                                                     top_p: float | None) -> None:
    ids, logits = hf_logits
    fields: dict[str, Any] = {"temperature": temperature}
    if top_k:
        fields["top_k"] = top_k
    if top_p:
        fields["top_p"] = top_p
    content = export(service, **fields)["choices"][0]["logprobs"]["content"]
    assert [p["token_id"] for p in content] == ids[1:]
    for position in (1, 7, len(ids) // 2, len(ids) - 1):
        got = {e["token_id"]: e["logprob"] for e in content[position - 1]["top_logprobs"]}
        want = reference(logits[position - 1], temperature, top_k, top_p, 20)
        assert set(got) == set(want), position
        for token, logprob in want.items():
            assert got[token] == pytest.approx(logprob, abs=2e-3), (position, token)


def test_every_position_sums_to_one_and_names_its_token(service: Service) -> None:
    result = export(service, temperature=0.9, top_p=0.95)
    choice = result["choices"][0]
    assert choice["logprobs"]["distribution_type"] == "topk-renorm"
    for position in choice["logprobs"]["content"]:
        total = sum(math.exp(e["logprob"]) for e in position["top_logprobs"])
        assert total == pytest.approx(1.0, abs=1e-5)
        assert [e["rank"] for e in position["top_logprobs"]] == list(range(1, len(position["top_logprobs"]) + 1))
        listed = {e["token_id"]: e["logprob"] for e in position["top_logprobs"]}
        assert position["logprob"] == listed.get(position["token_id"])
        assert bytes(position["bytes"]).decode("utf-8", errors="replace") == position["token"]


def test_processing_changes_the_distribution_as_expected(service: Service) -> None:
    raw = export(service)["choices"][0]["logprobs"]["content"]
    sharp = export(service, temperature=0.5)["choices"][0]["logprobs"]["content"]
    cut = export(service, top_k=3)["choices"][0]["logprobs"]["content"]
    assert all(len(p["top_logprobs"]) == 20 for p in raw)
    assert all(len(p["top_logprobs"]) <= 3 for p in cut)
    sharper = sum(s["top_logprobs"][0]["logprob"] >= r["top_logprobs"][0]["logprob"] - 1e-6
                  for s, r in zip(sharp, raw, strict=True))
    assert sharper == len(raw)
    banned = raw[4]["top_logprobs"][0]["token_id"]
    biased = export(service, logit_bias={str(banned): -100})["choices"][0]["logprobs"]["content"]
    assert banned not in {e["token_id"] for e in biased[4]["top_logprobs"]}


def test_a_target_that_survives_top_p_beyond_the_exported_k_has_its_rank(service: Service) -> None:
    wide = export(service, compression_top_k=200, top_p=0.9)["choices"][0]["logprobs"]["content"]
    narrow = export(service, compression_top_k=1, top_p=0.9)["choices"][0]["logprobs"]["content"]
    checked = 0
    for w, n in zip(wide, narrow, strict=True):
        survivors = len(w["top_logprobs"])
        if w["rank"] is not None and 1 < w["rank"] <= survivors < 200:
            assert n["rank"] == w["rank"], (w["token"], w["rank"], n["rank"])
            checked += 1
    assert checked >= 3


def test_export_is_prefill_only(service: Service) -> None:
    result = export(service)
    assert result["choices"][0]["text"] == ""
    assert result["usage"]["completion_tokens"] == 0
    assert result["usage"]["prompt_tokens"] == len(result["choices"][0]["logprobs"]["content"]) + 1
    assert wait_until_idle(service) == 0


def test_streaming_delivers_every_position_once_in_order(service: Service) -> None:
    long_text = TEXT * 12
    body = {"model": MODEL, "prompt": [TEXT, long_text], "compression": True, "compression_top_k": 5,
            "stream": True, "stream_options": {"include_usage": True}}
    seen: dict[int, list[int]] = {0: [], 1: []}
    finished = set()
    usage = None
    with service.client() as client, client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                assert choice["index"] not in finished
                block = choice["logprobs"]
                assert block["offset"] == len(seen[choice["index"]]) + 1
                seen[choice["index"]] += [p["token_id"] for p in block["content"]]
                if choice["finish_reason"]:
                    finished.add(choice["index"])
    assert finished == {0, 1}
    plain = export(service, prompt=[TEXT, long_text], compression_top_k=5)
    for index in (0, 1):
        assert seen[index] == [p["token_id"] for p in plain["choices"][index]["logprobs"]["content"]]
    assert usage is not None and usage["completion_tokens"] == 0


def test_binary_export_matches_json(service: Service) -> None:
    body = {"model": MODEL, "prompt": [TEXT, TEXT[:40]], "compression": True, "compression_top_k": 8,
            "temperature": 0.8}
    with service.client() as client:
        response = client.post("/v1/completions", json=body, headers={"Accept": "application/octet-stream"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/octet-stream"
    header, documents = read_all(io.BytesIO(response.content))
    assert header.k == 8 and len(documents) == 2
    plain = export(service, prompt=[TEXT, TEXT[:40]], compression_top_k=8, temperature=0.8)
    for document, choice in zip(documents, plain["choices"], strict=True):
        content = choice["logprobs"]["content"]
        assert document.targets.tolist() == [p["token_id"] for p in content]
        for row, position in enumerate(content):
            assert document.ids[row, : len(position["top_logprobs"])].tolist() == \
                [e["token_id"] for e in position["top_logprobs"]]
            assert document.logprobs[row, 0] == pytest.approx(position["top_logprobs"][0]["logprob"], abs=1e-6)


def test_openai_sdk_can_request_an_export(openai_client: Any) -> None:
    completion = openai_client.completions.create(model=MODEL, prompt=TEXT, max_tokens=0,
                                                  extra_body={"compression": True, "compression_top_k": 3})
    content = completion.choices[0].logprobs.model_extra["content"]
    assert completion.choices[0].text == "" and len(content) > 10


@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 2}, "n"), ({"max_tokens": 4}, "max_tokens"), ({"compression_top_k": 0}, "compression_top_k"),
    ({"compression_top_k": 100000}, "compression_top_k"), ({"temperature": 0}, "temperature"),
    ({"temperature": 0.005}, "temperature"),
    ({"logprobs": 2}, "logprobs"), ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"), ({"echo": True}, "echo"),
])
def test_unsupported_export_requests_get_a_clear_400(service: Service, fields: dict[str, Any], param: str) -> None:
    body = {"model": MODEL, "prompt": TEXT, "compression": True, **fields}
    with service.client() as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
