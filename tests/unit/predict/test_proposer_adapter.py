"""The engine adapter gives each request's state its prompt tokens and keeps its usage counts readable."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cascade.vllm_compat.proposer import StaticTextProposer
from cascade.vllm_compat.request_keys import prediction_extra_args

from tests.unit.predict.toy_tokens import ToyTokenizer
from tests.unit.vllm_compat.stand_ins import toy_proposer

PROMPT = "def helper(value):\n    return value\n"


@pytest.fixture
def toy() -> ToyTokenizer:
    return ToyTokenizer()


@pytest.fixture
def proposer(monkeypatch: pytest.MonkeyPatch, toy: ToyTokenizer) -> StaticTextProposer:
    return toy_proposer(monkeypatch, toy, 8)


def request(toy: ToyTokenizer, prompt: list[int], with_ids: bool) -> Any:
    params = SimpleNamespace(max_tokens=50, extra_args=prediction_extra_args(toy.encode_text("def helper"), "smart"))
    return SimpleNamespace(sampling_params=params, num_prompt_tokens=len(prompt),
                           prompt_token_ids=prompt if with_ids else None)


@pytest.mark.parametrize("with_ids", [True, False])
def test_the_prompt_tokens_become_a_draft_source(proposer: StaticTextProposer, toy: ToyTokenizer,
                                                 with_ids: bool) -> None:
    """From the request's ``prompt_token_ids``, else from the first ``num_prompt_tokens`` of its row."""
    prompt = toy.encode_text(PROMPT)
    written = toy.encode_text("def helper")
    row = np.array([[*prompt, *written, 0, 0, 0]])
    proposer.bind_batch(["r"], {"r": request(toy, prompt, with_ids)})
    drafts = proposer.propose([written], np.array([len(prompt) + len(written)]), row)
    assert drafts[0] and drafts[0] == prompt[len(written):len(written) + len(drafts[0])]
    assert proposer.states["r"].last_source == "prompt"


def test_drafts_copied_from_the_prompt_are_not_prediction_tokens_in_the_usage_ledger(
        proposer: StaticTextProposer, toy: ToyTokenizer) -> None:
    prompt = toy.encode_text(PROMPT)
    written = toy.encode_text("def helper")
    requests = {"r": request(toy, prompt, True)}
    proposer.bind_batch(["r"], requests)
    draft = proposer.propose([written], np.array([len(prompt) + len(written)]), None)[0]
    assert draft and proposer.states["r"].last_source == "prompt"
    proposer.bind_batch(["r"], requests)
    step = [*draft, toy.id("zzz")]
    proposer.propose([step], np.array([len(prompt) + len(written) + len(step)]), None)
    assert proposer.states["r"].accepted_by_source["prompt"] == len(draft)
    requests.clear()
    assert proposer.prediction_usage("r", len(written) + len(step)) == (0, 0)


def test_a_finished_response_drafts_for_the_next_request_of_its_user(
        monkeypatch: pytest.MonkeyPatch, toy: ToyTokenizer) -> None:
    """The engine keeps finished outputs per ``user`` scope; another scope never sees them."""
    proposer = toy_proposer(monkeypatch, toy, 8, response_cache_tokens=1000)
    answer = toy.encode_text("return sorted(set(values), key=abs)\n")

    def ask(req_id: str, scope: str) -> Any:
        from vllm.sampling_params import SamplingType

        params = SimpleNamespace(max_tokens=50, sampling_type=SamplingType.GREEDY, extra_args=prediction_extra_args(
            toy.encode_text("pass"), "smart", scope=scope))
        return SimpleNamespace(sampling_params=params, num_prompt_tokens=1, prompt_token_ids=[toy.id("x")])

    first = {"a": ask("a", "alice")}
    for written in range(0, len(answer), 3):
        proposer.bind_batch(["a"], first)
        proposer.propose([answer[written:written + 3]], np.array([1 + written + 3]), None)
    first.clear()
    proposer.release_finished()
    for req_id, scope, drafts in (("b", "alice", True), ("c", "bob", False)):
        requests = {req_id: ask(req_id, scope)}
        proposer.bind_batch([req_id], requests)
        draft = proposer.propose([answer[:3]], np.array([4]), None)[0]
        assert (draft == answer[3:3 + len(draft)] and len(draft) > 0) is drafts
        assert (proposer.states[req_id].last_source == "responses") is drafts


def first_row_draft(monkeypatch: pytest.MonkeyPatch, toy: ToyTokenizer, rows: int,
                    seed: int | None = None, crowding: float = 0.5) -> list[int]:
    """The draft of the first of ``rows`` like requests verified in one step (``seed``: the first one's)."""
    prompt = toy.encode_text(PROMPT)
    written = toy.encode_text("def helper")
    proposer = toy_proposer(monkeypatch, toy, 64, crowding=crowding)
    names = [f"r{i}" for i in range(rows)]
    requests = {name: request(toy, prompt, True) for name in names}
    requests["r0"].sampling_params.seed = seed
    proposer.bind_batch(names, requests)
    return proposer.propose([written] * rows, np.array([len(prompt) + len(written)] * rows), None)[0]


def test_requests_verified_together_draft_shorter_than_one_alone(monkeypatch: pytest.MonkeyPatch,
                                                                 toy: ToyTokenizer) -> None:
    """The adapter tells each request's state how many requests the engine step verifies."""
    alone, crowded = first_row_draft(monkeypatch, toy, 1), first_row_draft(monkeypatch, toy, 8)
    assert crowded and len(crowded) < len(alone) and crowded == alone[:len(crowded)]


def test_a_seeded_sampled_request_drafts_as_if_alone_in_a_crowded_step(monkeypatch: pytest.MonkeyPatch,
                                                                       toy: ToyTokenizer) -> None:
    """Its drafts decide which sample its seed gives: other requests in the step must not change them."""
    alone = first_row_draft(monkeypatch, toy, 1, seed=7)
    assert alone and first_row_draft(monkeypatch, toy, 8, seed=7) == alone


def test_crowding_zero_drafts_in_a_crowded_step_as_alone(monkeypatch: pytest.MonkeyPatch, toy: ToyTokenizer) -> None:
    """``prediction_draft_crowding`` 0 (a GPU): the step's other requests do not shorten drafts."""
    alone = first_row_draft(monkeypatch, toy, 1, crowding=0)
    assert alone and first_row_draft(monkeypatch, toy, 8, crowding=0) == alone


def test_code_elsewhere_drafts_for_a_request_but_never_for_a_seeded_sample(monkeypatch: pytest.MonkeyPatch,
                                                                            toy: ToyTokenizer) -> None:
    """Like earlier responses, code written elsewhere is not the request's own: it must not pick which sample
    a seed gives."""
    from cascade.predict.code_datastore import CodeDatastore
    from vllm.sampling_params import SamplingType

    new_code = toy.encode_text("class Pair:\n    def __init__(self, x, y):\n")
    store = CodeDatastore.build([new_code] * 3)
    proposer = toy_proposer(monkeypatch, toy, 8, datastore=store)
    requests = {name: request(toy, [toy.id("x")], True) for name in ("greedy", "seeded")}
    requests["greedy"].sampling_params.sampling_type = SamplingType.GREEDY
    requests["seeded"].sampling_params.seed = 7
    proposer.bind_batch(["greedy", "seeded"], requests)
    drafts = proposer.propose([new_code[:4]] * 2, np.array([5, 5]), None)
    assert drafts[0] and drafts[0] == new_code[4:4 + len(drafts[0])]
    assert proposer.states["greedy"].last_source == "successors"
    assert drafts[1] == [] and proposer.states["seeded"].datastore is None


def test_an_engine_whose_datastore_fails_to_build_still_drafts_from_the_request(monkeypatch: pytest.MonkeyPatch,
                                                                                 toy: ToyTokenizer) -> None:
    def broken(*args: Any) -> None:
        raise PermissionError("no reading the site-packages here")

    monkeypatch.setattr("cascade.vllm_compat.proposer.datastore_for", broken)
    proposer = toy_proposer(monkeypatch, toy, 8)
    assert proposer.datastore is None
    prompt = toy.encode_text(PROMPT)
    written = toy.encode_text("def helper")
    proposer.bind_batch(["r"], {"r": request(toy, prompt, True)})
    assert proposer.propose([written], np.array([len(prompt) + len(written)]), None)[0]
