"""The architecture matrix: the real service (real vLLM engines, the exact codec) on tiny random-weight
checkpoints the tests build (``tiny_models``): Qwen2 (attention bias, grouped-query attention), a
Llama with linear RoPE scaling and a tokenizer whose special tokens have other names and ids, a
Llama with llama3 RoPE scaling and no chat template, and a GPT-2 the exact codec does not run. One
service per checkpoint, started and stopped in turn; every feature is exercised over HTTP. The last
two serve bfloat16 and float16 engines on AVX2 kernels (what an AVX2-only host runs), where the
start-up probes must pass whatever ties half-precision logits hold."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import NamedTuple

import httpx
import pytest

from tests.integration.conftest import Service, start_service, stop_service
from tests.integration.tiny_models import MATRIX, TinyModel, build, model_vocab_of_tokenizer

PROMPT = "import os\n\ndef main(argv):\n    "
TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n"


class Served(NamedTuple):
    model: TinyModel
    service: Service
    eos_id: int  # as the checkpoint's generation config names it (pycoder's, or ``<|end|>``'s)
    tokenizer_size: int
    vocab_size: int  # the model's output vocabulary: padded past the tokenizer in one checkpoint


@pytest.fixture(scope="module", params=MATRIX, ids=[m.name for m in MATRIX])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model: TinyModel = request.param
    folder = build(model, tmp_path_factory.mktemp("checkpoints") / model.name)
    service = start_service(tmp_path_factory.mktemp(model.name), [
        "--model", str(folder), "--max-model-len", "256", "--kv-cache-mib", "32", "--codec-threads", "1",
        "--num-speculative-tokens", "8", "--prediction-datastore-mib", "2",  # a small one per tokenizer
        *model.serve_args], env_extra=model.env, timeout=600)
    generation = json.loads((folder / "generation_config.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    yield Served(model, service, int(generation["eos_token_id"]), model_vocab_of_tokenizer(folder),
                 int(config["vocab_size"]))
    stop_service(service)


def _post(service: Service, path: str, body: dict[str, object]) -> httpx.Response:
    with service.client() as client:
        return client.post(path, json={"model": _name(service), **body})


def _name(service: Service) -> str:
    with service.client() as client:
        return str(client.get("/v1/models").json()["data"][0]["id"])


def test_chat_answers_or_names_the_missing_chat_template(served: Served) -> None:
    model, service = served.model, served.service
    r = _post(service, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Write a function."}],
                                                 "max_tokens": 8, "temperature": 0})
    if model.chat_template:
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
    else:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "no_chat_template" and "chat template" in error["message"]


def test_completions_stream_the_same_text_as_without_streaming(served: Served) -> None:
    """Greedy, so the same text both ways in float32; half-precision engines only promise the token
    count (the second request reads the first one's prompt from the prefix cache, and bf16 logits of
    a random model can tie within the rounding of another kernel shape)."""
    model, service = served.model, served.service
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    plain = _post(service, "/v1/completions", body)
    assert plain.status_code == 200, plain.text
    assert plain.json()["usage"]["completion_tokens"] == 12
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with service.client() as client, client.stream("POST", "/v1/completions",
                                                   json={"model": _name(service), **streamed}) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    if "--dtype" not in model.serve_args:
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == plain.json()["choices"][0]["text"]


def test_a_prediction_of_the_output_is_accepted_and_changes_no_text(served: Served) -> None:
    model, service = served.model, served.service
    body = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    text = _post(service, "/v1/completions", body).json()["choices"][0]["text"]
    r = _post(service, "/v1/completions", {**body, "prediction": {"type": "content", "content": text}})
    if "--no-enable-predictions" in model.serve_args:
        assert r.status_code in (400, 503), r.text
        return
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == text
    assert r.json()["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_top_k_export_renormalises_every_position(served: Served) -> None:
    service = served.service
    with service.client() as client:
        prompt_ids = client.post("/v1/tokenize", json={"model": _name(service), "prompt": TEXT}).json()["tokens"]
    r = _post(service, "/v1/completions", {"prompt": TEXT, "compression": True, "compression_top_k": 4,
                                           "top_k": 3})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [p["token_id"] for p in content] == prompt_ids[1:]
    for position in content:
        candidates = position["top_logprobs"]
        assert 3 <= len(candidates) <= 4
        assert math.fsum(math.exp(c["logprob"]) for c in candidates) == pytest.approx(1.0, abs=1e-6)


def test_kcbs_keeps_the_models_own_eos_out_of_every_beam(served: Served) -> None:
    service = served.service
    r = _post(service, "/v1/kcbs", {"prompt": PROMPT, "beam_width": 3, "steps": 4})
    assert r.status_code == 200, r.text
    sequences = r.json()["sequences"]
    assert len(sequences) == 3 and all(len(s["token_ids"]) == 4 for s in sequences)
    assert all(served.eos_id not in s["token_ids"] for s in sequences)
    assert 0 < r.json()["captured_probability"] <= 1 + 1e-9


def test_codec_round_trips_or_is_503_with_the_reason(served: Served) -> None:
    model, service = served.model, served.service
    with service.client() as client:
        status = client.get("/ready").json()["codec"]
        # no top_k: the default (1024) is capped below the vocabulary of these small models
        r = client.post("/compress", content=TEXT.encode(), headers={"content-type": "text/plain"})
        if not model.codec:
            assert r.status_code == 503, r.text
            assert model.codec_reason in r.json()["error"]["message"] and status != "ok"
            return
        assert r.status_code == 200, r.text
        back = client.post("/decompress", content=r.content, headers={"content-type": "application/octet-stream"})
    assert back.status_code == 200, back.text
    assert back.content == TEXT.encode()


def test_an_export_of_the_whole_vocabulary_renders_ids_past_the_tokenizer(served: Served) -> None:
    if served.vocab_size == served.tokenizer_size or served.vocab_size > 1024:
        pytest.skip("the output vocabulary is the tokenizer's (or too large for one export)")
    r = _post(served.service, "/v1/completions", {"prompt": "def f():\n", "compression": True,
                                                  "compression_top_k": served.vocab_size})
    assert r.status_code == 200, r.text
    for position in r.json()["choices"][0]["logprobs"]["content"]:
        assert {c["token_id"] for c in position["top_logprobs"]} == set(range(served.vocab_size))
        padded = [c for c in position["top_logprobs"] if c["token_id"] >= served.tokenizer_size]
        assert padded and all(c["token"] == "" and c["bytes"] == [] for c in padded)
