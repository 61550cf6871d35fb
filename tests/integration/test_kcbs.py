"""``/v1/kcbs`` against the real engine: shapes, ordering, ρ, EOS policies, targets, streaming."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from tests.integration.conftest import MODEL, Service

PROMPT = "import os\n\ndef "


def _kcbs(service: Service, **body: object) -> httpx.Response:
    with service.client() as client:
        return client.post("/v1/kcbs", json={"model": MODEL, "prompt": PROMPT, **body})


def test_kcbs_returns_k_sequences_best_first_with_exact_length(service: Service) -> None:
    r = _kcbs(service, beam_width=3, steps=5)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "kcbs.result"
    seqs = body["sequences"]
    assert len(seqs) == 3
    assert [s["score"] for s in seqs] == sorted((s["score"] for s in seqs), reverse=True)
    assert all(len(s["token_ids"]) == 5 and s["finish_reason"] == "length" for s in seqs)
    assert math.isclose(body["captured_probability"], math.fsum(s["probability"] for s in seqs), rel_tol=1e-9)
    assert 0 < body["captured_probability"] <= 1


def test_single_step_top_k_probabilities_sum_to_one(service: Service) -> None:
    body = _kcbs(service, beam_width=4, steps=1).json()
    assert math.isclose(body["captured_probability"], 1.0, rel_tol=1e-6)


def test_no_final_prune_returns_all_candidates_and_captures_more(service: Service) -> None:
    pruned = _kcbs(service, beam_width=3, steps=4, final_prune=True).json()
    full = _kcbs(service, beam_width=3, steps=4, final_prune=False).json()
    assert len(full["sequences"]) == 9
    assert full["captured_probability"] >= pruned["captured_probability"]
    assert full["sequences"][:3] == pruned["sequences"]


def test_greedy_continuation_is_found_as_exact_target(service: Service, openai_client) -> None:
    greedy = openai_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    with service.client() as client:
        ids = client.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 6,
                                                   "temperature": 0, "logprobs": 0}).json()
    assert ids["choices"][0]["text"] == greedy.choices[0].text
    body = _kcbs(service, beam_width=4, steps=6, target=greedy.choices[0].text).json()
    match = body["target_match"]
    assert match["exact"] is True
    assert match["near_verbatim_probability"] > 0
    best = body["sequences"][match["matches"][0]]
    assert best["text"] == greedy.choices[0].text


def test_eos_stop_policy_may_end_beams_early(service: Service) -> None:
    body = _kcbs(service, beam_width=2, steps=3, eos="stop", temperature=5.0).json()
    assert all(s["finish_reason"] in ("stop", "length") for s in body["sequences"])
    blocked = _kcbs(service, beam_width=2, steps=3, eos="block").json()
    assert all(1 not in s["token_ids"] for s in blocked["sequences"])


def test_streaming_sends_one_event_per_step_then_result(service: Service) -> None:
    events = []
    with service.client() as client, client.stream("POST", "/v1/kcbs", json={
            "model": MODEL, "prompt": PROMPT, "beam_width": 2, "steps": 4, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert [p["step"] for p in parsed[:-1]] == [1, 2, 3, 4]
    assert parsed[-1]["object"] == "kcbs.result"
    assert parsed[-2]["beams"][0]["text"] == parsed[-1]["sequences"][0]["text"]


@pytest.mark.parametrize(
    ("body", "param"),
    [({"beam_width": 0, "steps": 2}, "beam_width"), ({"beam_width": 65, "steps": 2}, "beam_width"),
     ({"beam_width": 2, "steps": 0}, "steps"), ({"beam_width": 2, "steps": 5000}, "steps"),
     ({"beam_width": 2, "steps": 2, "temperature": 0}, "temperature")],
)
def test_invalid_kcbs_parameters_are_400(service: Service, body: dict, param: str) -> None:
    r = _kcbs(service, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_concurrent_kcbs_requests_agree_with_sequential(service: Service) -> None:
    alone = _kcbs(service, beam_width=2, steps=3).json()["sequences"]

    async def many() -> list[dict]:
        async with httpx.AsyncClient(base_url=service.base_url, headers=service.headers, timeout=120) as client:
            responses = await asyncio.gather(*(client.post("/v1/kcbs", json={
                "model": MODEL, "prompt": PROMPT, "beam_width": 2, "steps": 3}) for _ in range(4)))
        return [r.json() for r in responses]

    for body in asyncio.run(many()):
        assert [s["token_ids"] for s in body["sequences"]] == [s["token_ids"] for s in alone]


@pytest.mark.parametrize("body", [{"beam_width": "2", "steps": 2}, {"beam_width": True, "steps": 2},
                                  {"beam_width": 2, "steps": 2, "final_prune": "yes"},
                                  {"beam_width": 2, "steps": "2"}])
def test_wrong_types_are_400_not_coerced(service: Service, body: dict) -> None:
    r = _kcbs(service, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in set(body)


def test_target_token_ids_outside_the_vocabulary_are_400(service: Service) -> None:
    r = _kcbs(service, beam_width=2, steps=2, target=[1, 10**9])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "target"


def test_captured_probability_is_at_most_one(service: Service) -> None:
    body = _kcbs(service, prompt="for i in range(", beam_width=4, steps=1).json()
    assert 0.999 < body["captured_probability"] <= 1.0


def test_sequences_report_the_models_own_probability_beside_the_top_k_one(service: Service) -> None:
    body = _kcbs(service, beam_width=3, steps=4).json()
    for seq in body["sequences"]:
        assert seq["model_probability"] == pytest.approx(math.exp(seq["model_logprob"]))
        assert 0 < seq["model_probability"] <= seq["probability"]


def test_a_text_target_matches_a_sequence_with_its_text_in_another_tokenisation(service: Service) -> None:
    body = _kcbs(service, prompt="def f():\n    pass", beam_width=8, steps=2, target="\n\n").json()
    same = [i for i, s in enumerate(body["sequences"]) if s["text"] == "\n\n"]
    assert same, [s["text"] for s in body["sequences"]]
    assert body["target_match"]["exact"] is True
    assert set(same) <= set(body["target_match"]["matches"])


def test_eos_stop_leaves_the_eos_token_out_of_the_text(service: Service) -> None:
    body = _kcbs(service, prompt="if __name__ == '__main__':\n    main()\n", beam_width=16, steps=2,
                 eos="stop").json()
    stopped = [s for s in body["sequences"] if s["finish_reason"] == "stop"]
    assert stopped, [s["text"] for s in body["sequences"]]
    assert all("</s>" not in s["text"] for s in body["sequences"])
