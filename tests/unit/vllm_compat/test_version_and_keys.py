"""Exact version pin, the plugin, the request markers, and what the light modules import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cascade.vllm_compat import request_keys
from cascade.vllm_compat.version import PINNED_VLLM, IncompatibleVllmError, check_vllm_version

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu"])
def test_the_pinned_release_passes(version: str) -> None:
    assert PINNED_VLLM == "0.32.0"
    assert check_vllm_version(version) == version


@pytest.mark.parametrize("version", ["0.32.1", "0.32", "0.32.0rc1", "0.32.0.post1", "0.33.0", "dev"])
def test_anything_else_is_refused_naming_both_versions(version: str) -> None:
    with pytest.raises(IncompatibleVllmError, match=rf"vLLM 0\.32\.0 exactly; found vLLM {version}"):
        check_vllm_version(version)


def test_installed_vllm_and_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = pytest.importorskip("vllm")
    from cascade import plugin

    assert check_vllm_version() == vllm.__version__
    plugin.register()
    monkeypatch.setattr(vllm, "__version__", "0.32.1")
    with pytest.raises(IncompatibleVllmError):
        plugin.register()


def test_light_modules_import_neither_torch_nor_vllm() -> None:
    code = ("import cascade.vllm_compat, cascade.vllm_compat.request_keys, cascade.vllm_compat.worker_extension, "
            "cascade.plugin, sys; bad = {'torch', 'vllm'} & set(sys.modules); assert not bad, bad")
    env = {"PYTHONPATH": str(ROOT / "service"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_request_markers() -> None:
    params = pytest.importorskip("vllm").SamplingParams
    assert request_keys.is_export_request(params(extra_args=request_keys.export_extra_args()))
    assert not request_keys.is_export_request(params())
    assert not request_keys.is_export_request(None)
    extra = request_keys.prediction_extra_args((3, 4), "exact", adaptive=False, scope="ab12")
    assert extra == {request_keys.PREDICTION_KEY: {"ids": [3, 4], "mode": "exact", "adaptive": False, "scope": "ab12"}}
    assert request_keys.prediction_spec(params(extra_args=extra)) == extra[request_keys.PREDICTION_KEY]
    assert request_keys.prediction_spec(params()) is None
    assert request_keys.EXPORT_KEY == "cascade_export" and request_keys.PREDICTION_KEY == "cascade_prediction"


def test_the_predict_engine_loads_the_moved_proposer() -> None:
    from cascade.engine.config import EngineRole, engine_kwargs
    from cascade.settings import Settings
    from cascade.vllm_compat.proposer import PROPOSER, StaticTextProposer

    kwargs = engine_kwargs(Settings(), EngineRole.PREDICT, cpu=True)
    assert kwargs["speculative_config"]["model"] == PROPOSER
    module, name = PROPOSER.rsplit(".", 1)
    assert getattr(sys.modules[module], name) is StaticTextProposer
