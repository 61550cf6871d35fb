"""``Settings`` is the single source of every limit and of the README's two settings tables."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from cascade.cli import config_table, limits_table
from cascade.settings import LIMITS, Settings, load_settings

README = Path(__file__).resolve().parents[2] / "README.md"
NOT_REQUEST_LIMITS = {"max_num_seqs"}  # engine batching, not something a request can inflate


def test_every_limit_is_a_setting_and_every_max_setting_is_a_listed_limit() -> None:
    names = [name for name, _, _ in LIMITS]
    assert len(names) == len(set(names))
    assert set(names) <= set(Settings.model_fields)
    bounded = {name for name in Settings.model_fields
               if name.startswith("max_") or name.endswith("_timeout_seconds")} - NOT_REQUEST_LIMITS
    assert bounded <= set(names), f"limits missing from settings.LIMITS: {sorted(bounded - set(names))}"


@pytest.mark.parametrize("table", [config_table, limits_table])
def test_readme_tables_are_the_generated_ones(table: Callable[[], int]) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        table()
    readme = README.read_text()
    stale = [line for line in out.getvalue().splitlines() if line not in readme]
    flag = " --limits" if table is limits_table else ""
    assert not stale, f"README is out of date; regenerate with `cascade config-table{flag}`: {stale}"
    rows = [line for line in out.getvalue().splitlines() if line.startswith("|")]
    assert "\n".join(rows) in readme, f"README's table has rows the generated one lacks: `cascade config-table{flag}`"


def test_config_table_takes_only_limits_and_refuses_anything_else(capsys: pytest.CaptureFixture[str]) -> None:
    from cascade.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["config-table", "--bogus"])
    assert refused.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert main(["config-table", "--limits"]) == 0
    assert capsys.readouterr().out.startswith("| setting | env var |")


@pytest.mark.parametrize("value", ["", "null", "None", " NULL "])
def test_an_optional_setting_set_empty_or_null_in_the_environment_is_off(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_ENGINE_STALL_SECONDS", value)
    monkeypatch.setenv("CASCADE_REQUEST_TIMEOUT_SECONDS", value)
    monkeypatch.setenv("CASCADE_KV_CACHE_MIB", value)
    settings = Settings()
    off = (settings.engine_stall_seconds, settings.request_timeout_seconds, settings.kv_cache_mib)
    assert off == (None, None, None)


def test_an_optional_setting_given_empty_on_the_command_line_is_off() -> None:
    settings = load_settings(["--engine-stall-seconds", "", "--request-timeout-seconds", "null"])
    assert settings.engine_stall_seconds is None and settings.request_timeout_seconds is None
