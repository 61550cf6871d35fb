"""cascade_install_hooks checks the live runner before installing; the RPC helpers' contracts."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from cascade.vllm_compat import bind_batch_hook, export_hook
from cascade.vllm_compat.version import IncompatibleVllmError
from cascade.vllm_compat.worker_extension import (
    HOOKS,
    INSTALL_HOOKS_RPC,
    LIVE_STATE_RPC,
    WORKER_EXTENSION,
    CascadeWorkerExtension,
    check_installed,
    install_engine_hooks,
    merge_counts,
    missing_for,
)

from tests.unit.vllm_compat.stand_ins import DraftingRunner, StandInRunner, fresh

pytest.importorskip("vllm")


class Worker(CascadeWorkerExtension):
    def __init__(self, runner: Any) -> None:
        self.model_runner = runner


class RaisingBuffer:
    @property
    def np(self) -> Any:
        raise AttributeError("buffer has no numpy view")


def complete_runner() -> Any:
    runner = fresh(StandInRunner)({}, {})
    runner.drafter = SimpleNamespace(bind_batch=lambda req_ids, requests: None)
    type(runner).propose_draft_token_ids = DraftingRunner.propose_draft_token_ids
    type(runner)._input_fits_in_drafter = DraftingRunner._input_fits_in_drafter
    return runner


def test_constants() -> None:
    assert f"{CascadeWorkerExtension.__module__}.{CascadeWorkerExtension.__qualname__}" == WORKER_EXTENSION
    assert LIVE_STATE_RPC == "cascade_live_state" and hasattr(CascadeWorkerExtension, LIVE_STATE_RPC)
    assert INSTALL_HOOKS_RPC == "cascade_install_hooks" and hasattr(CascadeWorkerExtension, INSTALL_HOOKS_RPC)
    assert HOOKS == ("export", "bind_batch", "draft_sampling")


def test_installs_on_a_complete_runner() -> None:
    worker = Worker(complete_runner())
    assert worker.cascade_install_hooks(["export", "bind_batch"]) == ["export", "bind_batch"]
    cls = type(worker.model_runner)
    assert export_hook.is_installed(cls) and bind_batch_hook.is_installed(cls)
    assert worker.cascade_install_hooks(["export"]) == ["export"]  # idempotent


def test_names_what_an_incomplete_runner_lacks_and_installs_nothing() -> None:
    runner = complete_runner()
    runner.query_start_loc = RaisingBuffer()
    runner.num_prompt_logprobs = []
    runner.model = SimpleNamespace()
    with pytest.raises(IncompatibleVllmError) as info:
        Worker(runner).cascade_install_hooks(["bind_batch", "export"])
    message = str(info.value)
    assert "the export hook cannot be installed" in message
    for what in ("num_prompt_logprobs (a list, expected a dict)", "query_start_loc.np (absent)",
                 "model.compute_logits (absent)"):
        assert what in message
    assert "bind_batch hook" not in message  # its needs are met
    assert not export_hook.is_installed(type(runner)) and not bind_batch_hook.is_installed(type(runner))


def test_bind_batch_needs_cascades_drafter() -> None:
    runner = complete_runner()
    runner.drafter = object()  # another proposer, or none
    with pytest.raises(IncompatibleVllmError, match=r"bind_batch hook cannot be installed: model runner "
                                                    r"FreshStandInRunner lacks drafter.bind_batch \(absent\)"):
        Worker(runner).cascade_install_hooks(["bind_batch"])
    assert missing_for(runner, "export") == []


def test_no_runner_and_unknown_hook() -> None:
    with pytest.raises(IncompatibleVllmError, match="the worker lacks model_runner"):
        Worker(None).cascade_install_hooks(["export"])
    with pytest.raises(ValueError, match="unknown Cascade hook"):
        Worker(complete_runner()).cascade_install_hooks(["export", "nope"])


def test_live_state_still_counts() -> None:
    runner = complete_runner()
    runner.drafter = SimpleNamespace(release_finished=lambda: 0, states={"a": 1}, logs={},
                                     responses=SimpleNamespace(tokens=12), datastore=SimpleNamespace(ngrams=345))
    counts = Worker(runner).cascade_live_state()
    assert counts == {"runner_requests": 0, "batch_rows": 0, "prediction_states": 1, "prediction_debug_logs": 0,
                      "prediction_response_tokens": 12, "prediction_datastore_ngrams": 345}
    assert merge_counts([counts, {**counts, "batch_rows": -1}])["batch_rows"] == -1


def test_extension_does_not_clash_with_vllms_workers() -> None:
    """vLLM refuses an extension whose attribute names its worker class already has."""
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker as GPUWorker

    ours = {name for name in dir(CascadeWorkerExtension) if not name.startswith("__")}
    assert ours and not ours & set(dir(CPUWorker)) and not ours & set(dir(GPUWorker))


class FakeEngine:
    def __init__(self, result: Any = None, error: Exception | None = None) -> None:
        self.result, self.error, self.calls = result, error, []

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                             kwargs: dict | None = None) -> Any:
        self.calls.append((method, args))
        if self.error is not None:
            raise self.error
        return self.result


def test_install_engine_hooks() -> None:
    engine = FakeEngine([["export"], ["export"]])
    asyncio.run(install_engine_hooks(engine, ["export"]))
    assert engine.calls == [(INSTALL_HOOKS_RPC, (["export"],))]
    # what vLLM 0.32 raises when the worker's method raised: a plain Exception quoting the message
    failed = FakeEngine(error=Exception("Call to collective_rpc method failed: Worker failed with error 'the "
                                        "bind_batch hook cannot be installed: ...', please check the stack trace"))
    with pytest.raises(IncompatibleVllmError, match=r"hooks \['bind_batch'\] failed: .*bind_batch hook cannot"):
        asyncio.run(install_engine_hooks(failed, ["bind_batch"]))
    with pytest.raises(IncompatibleVllmError, match="worker 1 installed"):
        check_installed([["export"], []], ["export"])
