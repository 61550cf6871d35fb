"""The bind_batch hook binds the runner's rows before every propose; the proposer refuses a step it
was not bound to, so a vLLM that stops calling the hooked method fails loudly."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cascade.vllm_compat.bind_batch_hook import install_bind_batch_hook, is_installed
from cascade.vllm_compat.proposer import StaticTextProposer
from cascade.vllm_compat.request_keys import prediction_extra_args
from cascade.vllm_compat.version import IncompatibleVllmError

from tests.unit.predict.toy_tokens import ToyTokenizer
from tests.unit.vllm_compat.stand_ins import DraftingRunner, fresh, toy_proposer

PREDICTION = "def f(x):\n    return x + 1\n"


@pytest.fixture
def toy() -> ToyTokenizer:
    return ToyTokenizer()


@pytest.fixture
def proposer(monkeypatch: pytest.MonkeyPatch, toy: ToyTokenizer) -> StaticTextProposer:
    return toy_proposer(monkeypatch, toy, 3)


def predicted(toy: ToyTokenizer) -> tuple[list[int], dict[str, Any]]:
    ids = toy.encode_text(PREDICTION)
    params = SimpleNamespace(max_tokens=50, extra_args=prediction_extra_args(ids, "smart"))
    return ids, {"with": SimpleNamespace(sampling_params=params, num_prompt_tokens=3),
                 "without": SimpleNamespace(sampling_params=SimpleNamespace(max_tokens=50, extra_args=None),
                                            num_prompt_tokens=3)}


def hooked_runner(proposer: Any, requests: dict[str, Any]) -> Any:
    runner = fresh(DraftingRunner)(proposer, requests)
    assert install_bind_batch_hook(type(runner)) is True
    assert install_bind_batch_hook(type(runner)) is False
    assert is_installed(type(runner))
    runner.input_batch.num_tokens_no_spec = np.array([4, 4])
    return runner


def test_bind_before_every_propose(proposer: StaticTextProposer, toy: ToyTokenizer) -> None:
    ids, requests = predicted(toy)
    runner = hooked_runner(proposer, requests)
    drafts = runner.propose_draft_token_ids(None, [[ids[0]], [7]])
    assert drafts[1] == []
    assert drafts[0] and drafts[0] == ids[1:1 + len(drafts[0])]
    assert set(proposer.states) == {"with"}
    # the next step is bound again by the hook
    runner.propose_draft_token_ids(None, [[ids[1]], [7]])


def test_propose_without_bind_raises(proposer: StaticTextProposer, toy: ToyTokenizer) -> None:
    ids, requests = predicted(toy)
    runner = fresh(DraftingRunner)(proposer, requests)  # hook not installed: vLLM "stopped calling" it
    runner.input_batch.num_tokens_no_spec = np.array([4, 4])
    with pytest.raises(IncompatibleVllmError, match=r"without bind_batch.*bind_batch hook no longer fires"):
        runner.propose_draft_token_ids(None, [[ids[0]], [7]])


def test_a_bind_arms_one_propose_only(proposer: StaticTextProposer, toy: ToyTokenizer) -> None:
    ids, requests = predicted(toy)
    proposer.bind_batch(["with", "without"], requests)
    proposer.propose([[ids[0]], [7]], np.array([4, 4]), None)
    with pytest.raises(IncompatibleVllmError):
        proposer.propose([[ids[1]], [7]], np.array([5, 4]), None)


def test_drafters_without_bind_batch_are_left_alone() -> None:
    calls: list[list[list[int]]] = []
    drafter = SimpleNamespace(propose=lambda sampled, *a, **k: calls.append(sampled) or [[]])
    runner = hooked_runner(drafter, {"a": SimpleNamespace()})
    assert runner.propose_draft_token_ids(None, [[1]]) == [[]]
    assert calls == [[[1]]]


def test_a_text_drafter_drafts_near_the_end_of_the_context(proposer: StaticTextProposer, toy: ToyTokenizer) -> None:
    _, requests = predicted(toy)
    runner = hooked_runner(proposer, requests)
    assert runner._input_fits_in_drafter(SimpleNamespace(max_seq_len=1000)) is True
    assert runner._input_fits_in_drafter(None) is False


def test_a_model_drafter_keeps_vllms_context_rule() -> None:
    drafter = SimpleNamespace(propose=lambda sampled, *a, **k: [[]])
    runner = hooked_runner(drafter, {"a": SimpleNamespace()})
    assert runner._input_fits_in_drafter(SimpleNamespace(max_seq_len=1000)) is False
    assert runner._input_fits_in_drafter(SimpleNamespace(max_seq_len=900)) is True


@pytest.mark.parametrize(("total", "room"), [(60, 64), (252, 3), (255, 0)])
def test_a_draft_near_the_end_of_the_context_stops_there(monkeypatch: pytest.MonkeyPatch, toy: ToyTokenizer,
                                                         total: int, room: int) -> None:
    """With vLLM's own context rule switched off for it, the drafter is what keeps every drafted
    position inside ``max_model_len`` (256 here): at most ``max_model_len − total − 1`` tokens."""
    proposer = toy_proposer(monkeypatch, toy, 64)
    ids = toy.encode_text(PREDICTION * 12)
    params = SimpleNamespace(max_tokens=1000, extra_args=prediction_extra_args(ids, "smart"))
    runner = hooked_runner(proposer, {"r": SimpleNamespace(sampling_params=params, num_prompt_tokens=40)})
    runner.input_batch.num_tokens_no_spec = np.array([total])
    draft = runner.propose_draft_token_ids(None, [[ids[0]]])[0]
    assert draft == ids[1:1 + len(draft)]
    assert len(draft) <= room and (room == 0 or len(draft) > 0)
