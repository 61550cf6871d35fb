"""Every capability on a real instruct model (SmolLM2-135M-Instruct: ChatML, vocabulary 49,152, 30 layers),
served end to end. The asserted properties hold for any greedy output, so they do not depend on which
text this host's float kernels make the model write."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.integration.conftest import Service
from tests.realmodel.conftest import MODEL

SOURCE = '''def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)


def describe(width, height):
    return f"{width}x{height}: area {area(width, height)}, perimeter {perimeter(width, height)}"
'''

# The first test's setup fetches and converts the model on a fresh machine, then starts the service.
pytestmark = pytest.mark.timeout(1200)

CODE = (Path(__file__).resolve().parents[2] / "service" / "cascade" / "model_registry" / "registry.py").read_text()


def chat(client: Any, content: str, max_tokens: int = 120, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=max_tokens, temperature=0, **kwargs)


def test_chat_uses_the_models_chatml_template_and_streams_the_same_text(real_client: Any, tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    plain = real_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=80, temperature=0)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert plain.usage.prompt_tokens == len(rendered)
    assert tokenizer.decode(rendered).startswith("<|im_start|>system\n")
    text = plain.choices[0].message.content
    assert text and "<|im_" not in text
    chunks = list(real_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=80, temperature=0,
                                                      stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [plain.choices[0].finish_reason]


def test_structured_output_follows_a_json_schema(real_client: Any) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age", "languages"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                             "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}}
    reply = chat(real_client, "Describe a programmer called Ann, aged 31, who knows Python and C, as JSON.",
                 max_tokens=80, response_format={"type": "json_schema",
                                                 "json_schema": {"name": "person", "schema": schema, "strict": True}})
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == {"name", "age", "languages"}
    assert isinstance(value["name"], str) and isinstance(value["age"], int)
    assert all(isinstance(x, str) for x in value["languages"]) and len(value["languages"]) <= 3


@pytest.mark.parametrize("instruction", ["Rename the function area to rectangle_area everywhere.",
                                         "Add a docstring to every function."])
def test_prediction_of_the_original_file_is_accepted_on_an_edit_and_changes_no_text(
        real_client: Any, instruction: str) -> None:
    prompt = f"{instruction} Reply with the whole file only.\n\n```python\n{SOURCE}```"
    plain = chat(real_client, prompt, max_tokens=200)
    predicted = chat(real_client, prompt, max_tokens=200,
                     extra_body={"prediction": {"type": "content", "content": SOURCE}})
    assert predicted.choices[0].message.content == plain.choices[0].message.content
    details = predicted.usage.completion_tokens_details
    assert 0 < details.accepted_prediction_tokens <= predicted.usage.completion_tokens


def test_prediction_equal_to_the_answer_is_mostly_accepted(real_client: Any) -> None:
    prompt = f"Add type hints to this file. Reply with the whole file only.\n\n```python\n{SOURCE}```"
    plain = chat(real_client, prompt, max_tokens=200)
    text = plain.choices[0].message.content
    predicted = chat(real_client, prompt, max_tokens=200,
                     extra_body={"prediction": {"type": "content", "content": text}})
    assert predicted.choices[0].message.content == text
    accepted = predicted.usage.completion_tokens_details.accepted_prediction_tokens
    assert accepted >= 0.6 * predicted.usage.completion_tokens


def test_codec_round_trips_real_code_byte_for_byte_well_below_its_size(real_service: Service) -> None:
    data = CODE[:1024].encode()
    with httpx.Client(base_url=real_service.base_url, headers=real_service.headers, timeout=900) as client:
        packed = client.post("/compress", content=data, params={"lanes": 64},
                             headers={"content-type": "text/plain"})
        assert packed.status_code == 200, packed.text
        back = client.post("/decompress", content=packed.content,
                           headers={"content-type": "application/octet-stream"})
    assert back.status_code == 200, back.text
    assert back.content == data
    assert len(packed.content) < len(data) / 3


def test_kcbs_finds_the_greedy_continuation_first_with_its_probability(real_service: Service,
                                                                      real_client: Any) -> None:
    prompt = "def fibonacci(n):\n"
    greedy = real_client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    with real_service.client() as client:
        body = client.post("/v1/kcbs", json={"model": MODEL, "prompt": prompt, "beam_width": 3, "steps": 6,
                                             "target": greedy.choices[0].text}).json()
    seqs = body["sequences"]
    assert len(seqs) == 3 and all(len(s["token_ids"]) == 6 for s in seqs)
    assert [s["score"] for s in seqs] == sorted((s["score"] for s in seqs), reverse=True)
    assert math.isclose(body["captured_probability"], math.fsum(s["probability"] for s in seqs), rel_tol=1e-9)
    match = body["target_match"]
    assert match["exact"] is True and match["near_verbatim_probability"] > 0
    assert seqs[match["matches"][0]]["text"] == greedy.choices[0].text


def test_top_k_export_matches_the_float_model_computed_by_transformers(real_service: Service, model_path: Path,
                                                                       tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM

    text = CODE[:400]
    with real_service.client() as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": text, "compression": True,
                                                  "compression_top_k": 8})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert [p["token_id"] for p in content] == ids[1:]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    for position in (1, len(ids) // 3, len(ids) // 2, len(ids) - 1):
        probs = logits[position - 1].softmax(-1)
        top = torch.topk(probs, 8)
        total = float(top.values.sum())
        got = {e["token_id"]: e["logprob"] for e in content[position - 1]["top_logprobs"]}
        assert math.fsum(math.exp(v) for v in got.values()) == pytest.approx(1.0, abs=1e-5)
        for value, token in zip(top.values.tolist()[:4], top.indices.tolist()[:4], strict=True):
            assert got[int(token)] == pytest.approx(math.log(value / total), abs=5e-3), (position, token)
