"""The export hook processes exactly the export rows, restores the model, and fails loudly when vLLM
stops computing prompt logits the way it wraps."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from cascade.vllm_compat.export_hook import ExportHookError, export_rows, install_export_hook, is_installed
from cascade.vllm_compat.export_processing import process_prompt_logits
from cascade.vllm_compat.request_keys import export_extra_args
from cascade.vllm_compat.version import IncompatibleVllmError

from tests.unit.vllm_compat.stand_ins import BatchedRunner, CopyingRunner, StandInRunner, fresh, request

SamplingParams = pytest.importorskip("vllm").SamplingParams
PLAIN_PROMPT = [1, 2, 3, 4]
EXPORT_PROMPT = [5, 0, 2, 1, 3]


def export_params() -> Any:
    return SamplingParams(top_k=2, temperature=0.7, extra_args=export_extra_args())


def make(cls: type, export_computed: int = 0, **kwargs: Any) -> Any:
    requests = {"plain": request(PLAIN_PROMPT, SamplingParams()),
                "export": request(EXPORT_PROMPT, export_params(), export_computed)}
    scheduled = {"plain": len(PLAIN_PROMPT), "export": len(EXPORT_PROMPT) - export_computed}
    runner = fresh(cls)(requests, scheduled, **kwargs)
    install_export_hook(type(runner))
    return runner


def raw_logits(runner: Any, hidden: torch.Tensor, req_id: str) -> torch.Tensor:
    req = runner.requests[req_id]
    offset = int(runner.query_start_loc.np[runner.input_batch.req_id_to_index[req_id]])
    n = min(runner.scheduled[req_id], len(req.prompt_token_ids) - req.num_computed_tokens - 1)
    return runner.model.compute_logits(hidden[offset:offset + n])


def test_processes_export_rows_only_and_restores_compute_logits() -> None:
    runner = make(StandInRunner)
    hidden = runner.hidden_states()
    own = runner.model.compute_logits
    out = runner._get_prompt_logprobs_dict(hidden, runner.scheduled)
    assert torch.equal(out["plain"], raw_logits(runner, hidden, "plain"))
    params = runner.requests["export"].sampling_params
    expected = process_prompt_logits(raw_logits(runner, hidden, "export"), params, EXPORT_PROMPT, 1, 4)
    assert torch.equal(out["export"], expected)
    assert (torch.isfinite(out["export"]).sum(dim=-1) <= 2).all()
    assert "compute_logits" not in vars(runner.model)
    assert runner.model.compute_logits == own


def test_later_chunk_conditions_on_the_computed_prefix() -> None:
    runner = make(StandInRunner, export_computed=2)
    hidden = runner.hidden_states()
    out = runner._get_prompt_logprobs_dict(hidden, runner.scheduled)
    params = runner.requests["export"].sampling_params
    expected = process_prompt_logits(raw_logits(runner, hidden, "export"), params, EXPORT_PROMPT, 3, 4)
    assert torch.equal(out["export"], expected)


def test_a_request_with_no_prompt_row_left_is_not_expected() -> None:
    """vLLM skips a final chunk with nothing left to score; the hook must not call that unprocessed."""
    runner = make(StandInRunner, export_computed=len(EXPORT_PROMPT) - 1)
    runner.scheduled["export"] = 1
    assert export_rows(runner, runner.scheduled) == {}
    out = runner._get_prompt_logprobs_dict(runner.hidden_states(), runner.scheduled)
    assert "export" not in out


def test_an_instance_compute_logits_is_put_back() -> None:
    runner = make(StandInRunner)
    own = runner.model.compute_logits
    runner.model.compute_logits = own  # now an instance attribute
    runner._get_prompt_logprobs_dict(runner.hidden_states(), runner.scheduled)
    assert vars(runner.model)["compute_logits"] is own


def test_no_export_request_calls_the_original_untouched() -> None:
    runner = make(StandInRunner)
    runner.requests["export"].sampling_params = SamplingParams(top_k=2)
    hidden = runner.hidden_states()
    out = runner._get_prompt_logprobs_dict(hidden, runner.scheduled)
    assert torch.equal(out["export"], raw_logits(runner, hidden, "export"))


def test_idempotent_install() -> None:
    cls = fresh(StandInRunner)
    assert not is_installed(cls)
    assert install_export_hook(cls) is True
    assert install_export_hook(cls) is False
    assert is_installed(cls)


def test_logits_on_a_copy_raise_and_restore() -> None:
    runner = make(CopyingRunner)
    with pytest.raises(ExportHookError, match=r"export request\(s\) export were not processed: .*view") as info:
        runner._get_prompt_logprobs_dict(runner.hidden_states(), runner.scheduled)
    assert isinstance(info.value, IncompatibleVllmError)
    assert "compute_logits" not in vars(runner.model)


def test_logits_over_the_whole_step_raise() -> None:
    runner = make(BatchedRunner)
    with pytest.raises(ExportHookError, match=r"export request\(s\) export were not processed"):
        runner._get_prompt_logprobs_dict(runner.hidden_states(), runner.scheduled)


def test_batched_logits_at_an_export_offset_name_the_row_count() -> None:
    requests = {"export": request(EXPORT_PROMPT, export_params()), "plain": request(PLAIN_PROMPT, SamplingParams())}
    runner = fresh(BatchedRunner)(requests, {"export": len(EXPORT_PROMPT), "plain": len(PLAIN_PROMPT)})
    install_export_hook(type(runner))
    with pytest.raises(ExportHookError, match="compute_logits got 9 rows at the request's offset where 4"):
        runner._get_prompt_logprobs_dict(runner.hidden_states(), runner.scheduled)


def test_real_vllm_method_through_the_hook() -> None:
    """vLLM 0.32's own ``_get_prompt_logprobs_dict`` (on a subclass, run on a stand-in ``self``):
    the export's returned prompt top-k has only the top_k=2 survivors finite."""
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    cls = type("HookedRunner", (GPUModelRunner,), {})
    install_export_hook(cls)
    assert is_installed(cls) and not is_installed(GPUModelRunner)
    stand_in = make(StandInRunner)
    self = SimpleNamespace(**vars(stand_in), device="cpu", model_config=SimpleNamespace(logprobs_mode="raw_logprobs"),
                           sampler=Sampler(), _sync_device=lambda: None)
    out = cls._get_prompt_logprobs_dict(self, stand_in.hidden_states(), stand_in.scheduled)
    export, plain = out["export"], out["plain"]
    assert export is not None and plain is not None
    assert (torch.isfinite(export.logprobs[:, 1:]).sum(dim=-1) <= 2).all()
    assert (torch.isfinite(plain.logprobs[:, 1:]).sum(dim=-1) == 4).all()
    assert "compute_logits" not in vars(self.model)
