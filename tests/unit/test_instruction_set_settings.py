"""Every instruction-set setting a test or script asks for exists on any x86-64 host of the kind CI
runs on (AVX2, no AVX-512): ATen crashes on a capability the CPU lacks, and CI must pass on every
CPU generation of that machine kind."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# ONEDNN_MAX_CPU_ISA caps oneDNN (a cap above the host is harmless but tests nothing on AVX2-only
# hosts); ATEN_CPU_CAPABILITY selects kernels and must exist on the host.
AVAILABLE = {"ATEN_CPU_CAPABILITY": {"default", "avx2"}, "ONEDNN_MAX_CPU_ISA": {"SSE41", "AVX", "AVX2", "DEFAULT"}}
SETTING = re.compile(r"""["']?(ATEN_CPU_CAPABILITY|ONEDNN_MAX_CPU_ISA)["']?\s*[:=]\s*["']([A-Za-z0-9_]+)["']""")


def _settings() -> list[tuple[str, str, str]]:
    found = []
    for folder in ("tests", "benchmarks", "deploy", "service", "examples"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in {".py", ".sh", ".yml", ".yaml", ".toml"} and path.is_file() and path != Path(__file__):
                found += [(str(path.relative_to(REPO)), name, value)
                          for name, value in SETTING.findall(path.read_text(errors="replace"))]
    for path in (REPO / "dev", REPO / "Dockerfile", REPO / "docker-compose.yml"):
        if path.is_file():
            found += [(path.name, name, value) for name, value in SETTING.findall(path.read_text(errors="replace"))]
    return found


def test_the_scan_finds_the_suites_own_settings() -> None:
    assert any(where.startswith("tests/portability") for where, _, _ in _settings())


def test_no_test_asks_for_an_instruction_set_an_avx2_only_host_lacks() -> None:
    wrong = [f"{where}: {name}={value}" for where, name, value in _settings() if value not in AVAILABLE[name]]
    assert not wrong, "instruction sets some CI hosts lack:\n" + "\n".join(wrong)
