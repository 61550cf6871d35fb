"""The static contract holds on the installed vLLM and names what a changed vLLM would break."""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any

import msgspec
import pytest
from cascade.vllm_compat.contract import CHECKS, CLASSES, Check, check_problems, problems, require_compatible
from cascade.vllm_compat.version import IncompatibleVllmError

pytest.importorskip("vllm")


def test_installed_vllm_is_compatible() -> None:
    assert problems() == []
    start = time.perf_counter()
    require_compatible()
    assert time.perf_counter() - start < 1.0  # imports cached: the checks themselves are cheap


def test_every_check_names_a_known_class() -> None:
    assert {check.target for check in CHECKS} == set(CLASSES)


def test_a_changed_private_signature_is_named() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    class ChangedRunner:
        def _get_prompt_logprobs_dict(self, hidden_states: Any, scheduler_output: Any) -> Any: ...

        propose_draft_token_ids = GPUModelRunner.propose_draft_token_ids
        _input_fits_in_drafter = GPUModelRunner._input_fits_in_drafter

    assert problems({"GPUModelRunner": ChangedRunner}) == [
        "GPUModelRunner._get_prompt_logprobs_dict(self, hidden_states, num_scheduled_tokens) now takes "
        "(self, hidden_states, scheduler_output)"]
    del ChangedRunner.propose_draft_token_ids
    assert "GPUModelRunner.propose_draft_token_ids no longer exists" in problems({"GPUModelRunner": ChangedRunner})


def test_missing_fields_and_attributes_are_named_for_each_kind_of_class() -> None:
    class SamplingParams(msgspec.Struct):  # a msgspec Struct without skip_reading_prefix_cache
        extra_args: dict | None = None
        prompt_logprobs: int | None = None

    @dataclasses.dataclass
    class CompletionOutput:  # a dataclass that dropped spec_decode_metrics
        token_ids: list
        logprobs: Any
        finish_reason: str | None

    class RequestOutput:  # a plain class
        def __init__(self, prompt_logprobs: Any, outputs: Any, finished: bool) -> None: ...

    class RequestOutputKind(enum.Enum):
        CUMULATIVE = 0
        DELTA = 1

    class AsyncLLM:
        def generate(self) -> None: ...

    found = problems({"SamplingParams": SamplingParams, "CompletionOutput": CompletionOutput,
                      "RequestOutput": RequestOutput, "RequestOutputKind": RequestOutputKind, "AsyncLLM": AsyncLLM})
    for expected in ("SamplingParams has no field 'skip_reading_prefix_cache'",
                     "SamplingParams has no attribute 'bad_words_token_ids'",
                     "CompletionOutput has no field 'spec_decode_metrics'",
                     "RequestOutput has no field 'num_cached_tokens'",
                     "RequestOutputKind has no attribute 'FINAL_ONLY'",
                     "AsyncLLM has no attribute 'collective_rpc'",
                     "AsyncLLM.collective_rpc no longer exists"):
        assert expected in found
    assert not any("generate" in line for line in found)


def test_require_compatible_lists_every_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vllm.__version__", "0.33.0")
    monkeypatch.setitem(CLASSES, "FlatLogprobs", "vllm.logprobs:NoSuchClass")
    with pytest.raises(IncompatibleVllmError) as info:
        require_compatible({"RequestSpecDecodeMetrics": object})
    message = str(info.value)
    assert "found vLLM 0.33.0" in message and PINNED in message
    assert "cannot import vllm.logprobs:NoSuchClass" in message
    assert "RequestSpecDecodeMetrics has no field 'histogram'" in message
    assert "RequestSpecDecodeMetrics has no field 'num_draft_tokens'" in message


def test_one_line_per_check() -> None:
    extra = Check("AsyncLLM", "attrs", ("no_such_method",))
    assert problems(checks=[extra]) == ["AsyncLLM has no attribute 'no_such_method'"]
    assert problems(checks=[], version="0.32.1") != []


PINNED = "0.32.0"


def test_an_instance_attribute_init_no_longer_sets_is_a_problem() -> None:
    class Engine:
        def __init__(self) -> None:
            self.output_reader = None

    assert check_problems(Check("AsyncLLM", "assigns", ("output_reader",)), Engine) == []
    assert check_problems(Check("AsyncLLM", "assigns", ("output_handler",)), Engine) == [
        "AsyncLLM.__init__ no longer sets self.output_handler"]


def test_an_instance_attribute_init_only_reads_is_a_problem() -> None:
    class Engine:
        def __init__(self) -> None:
            self.output_handler: object | None = None
            if self.output_reader == 1 or self.output_reader is None:
                pass

    assert check_problems(Check("AsyncLLM", "assigns", ("output_handler",)), Engine) == []
    assert check_problems(Check("AsyncLLM", "assigns", ("output_reader",)), Engine) == [
        "AsyncLLM.__init__ no longer sets self.output_reader"]


def test_a_typed_dicts_keys_are_its_fields() -> None:
    from typing import NotRequired, TypedDict

    class TokensPrompt(TypedDict):  # a vLLM whose prompt dict no longer takes a cache salt
        prompt_token_ids: list[int]
        multi_modal_data: NotRequired[dict]

    assert problems({"TokensPrompt": TokensPrompt}, checks=[c for c in CHECKS if c.target == "TokensPrompt"],
                    version=PINNED) == ["TokensPrompt has no field 'cache_salt'"]
