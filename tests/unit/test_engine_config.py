"""Engine arguments per role: KV cache sizes are explicit on the CPU and follow the fractions on a GPU."""

from __future__ import annotations

from cascade.engine.config import CPU_KV_CACHE_MIB, EngineRole, engine_kwargs
from cascade.predict.datastore_corpus import DEFAULT_MIB
from cascade.predict.draft_length import ConfidenceLength
from cascade.settings import Settings
from cascade.vllm_compat.request_keys import DATASTORE_DIR_KEY, DATASTORE_MIB_KEY, DRAFT_CROWDING_KEY


def test_cpu_engines_get_fixed_kv_cache_sizes() -> None:
    settings = Settings()
    for role in EngineRole:
        kwargs = engine_kwargs(settings, role, cpu=True)
        assert kwargs["kv_cache_memory_bytes"] == CPU_KV_CACHE_MIB[role.value] << 20


def test_gpu_engines_size_their_kv_cache_from_the_memory_fraction() -> None:
    settings = Settings(memory_fraction=0.4, predict_memory_fraction=0.1)
    main = engine_kwargs(settings, EngineRole.MAIN, cpu=False)
    predict = engine_kwargs(settings, EngineRole.PREDICT, cpu=False)
    assert "kv_cache_memory_bytes" not in main and "kv_cache_memory_bytes" not in predict
    assert (main["gpu_memory_utilization"], predict["gpu_memory_utilization"]) == (0.4, 0.1)


def test_explicit_kv_cache_sizes_win_on_any_device() -> None:
    settings = Settings(kv_cache_mib=64)
    for cpu in (True, False):
        for role in EngineRole:
            assert engine_kwargs(settings, role, cpu=cpu)["kv_cache_memory_bytes"] == 64 << 20


def test_the_codec_runs_on_no_vllm_engine() -> None:
    assert {role.value for role in EngineRole} == {"main", "predict"}


def test_the_draft_crowding_setting_reaches_the_prediction_engine() -> None:
    kwargs = engine_kwargs(Settings(prediction_draft_crowding=0.0), EngineRole.PREDICT, cpu=True)
    assert kwargs["additional_config"][DRAFT_CROWDING_KEY] == 0.0


def test_the_code_datastore_settings_reach_the_prediction_engine() -> None:
    kwargs = engine_kwargs(Settings(prediction_datastore_mib=0, prediction_datastore_dir="/tmp/stores"),
                           EngineRole.PREDICT, cpu=True)
    assert kwargs["additional_config"][DATASTORE_MIB_KEY] == 0
    assert kwargs["additional_config"][DATASTORE_DIR_KEY] == "/tmp/stores"


def test_the_service_default_datastore_is_the_one_simulate_runs() -> None:
    """``simulate``'s default datastore is ``datastore_for``'s default size in the default cache directory."""
    assert Settings().prediction_datastore_mib == DEFAULT_MIB
    assert Settings().prediction_datastore_dir is None


def test_the_service_default_crowding_is_the_one_simulate_runs() -> None:
    """A replay of a request in a crowded step (``PredictionState``'s default lengths) drafts as the service does."""
    assert Settings().prediction_draft_crowding == ConfidenceLength.CROWDING
