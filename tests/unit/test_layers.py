"""The layering in docs/architecture.md, checked on the source: each layer imports only what it may.

Every ``import`` counts, also inside functions and under ``TYPE_CHECKING``: a lazy import is still a
dependency. A new module is checked by the package it lives in, so a rule cannot be dodged by
adding a file.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service"
CLIENTS = ROOT / "clients"

CORES = ("cascade.codec", "cascade.kcbs", "cascade.predict", "cascade.export")
GATEWAY_ONLY = ("cascade.api", "cascade.lifecycle", "cascade.app", "cascade.cli")
FRAMEWORKS = ("fastapi", "starlette", "uvicorn")


@dataclass(frozen=True)
class Layer:
    """Modules whose dotted name starts with one of ``packages`` may import none of ``forbidden``."""

    name: str
    packages: tuple[str, ...]
    forbidden: tuple[str, ...]


LAYERS = (
    Layer("shared wire format", ("cascade_common",),
          ("cascade", "cascade_client", "numpy", "torch", "vllm", *FRAMEWORKS)),
    Layer("client", ("cascade_client",), ("cascade", "torch", "vllm", *FRAMEWORKS)),
    Layer("pure cores", CORES,
          ("vllm", "cascade.engine", "cascade.vllm_compat", "cascade_client", *GATEWAY_ONLY, *FRAMEWORKS)),
    Layer("in-engine extensions", ("cascade.vllm_compat",),
          ("cascade.engine", "cascade_client", *GATEWAY_ONLY, *FRAMEWORKS)),
    Layer("engine adapter", ("cascade.engine",), ("cascade_client", *GATEWAY_ONLY, *FRAMEWORKS)),
    Layer("routes", ("cascade.api", "cascade.lifecycle", "cascade.app"),
          ("vllm", "torch", "cascade.vllm_compat", "cascade_client")),
    Layer("service", ("cascade",), ("cascade_client",)),
)
ALLOWED = {"cascade.cli": ("cascade_client.cli",)}  # ``cascade <client command>`` hands over to the client CLI
TORCH_CORES = ("cascade.codec.exact",)  # the exact model is torch kernels; no other core loads torch


def _modules() -> dict[str, Path]:
    found = {}
    for root in (SERVICE, CLIENTS):
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(modules: dict[str, Path]) -> list[str]:
    """``module → import (layer)`` for every import a layer forbids."""
    found = []
    for module, path in sorted(modules.items()):
        every = {name for name in _imports(module, path) if not _within(name, ALLOWED.get(module, ()))}
        imports = every - {name for name in every if name.rpartition(".")[0] in every}  # ``from m import x``: m
        for layer in LAYERS:
            if not _within(module, layer.packages):
                continue
            for name in sorted(imports):
                if _within(name, layer.forbidden):
                    found.append(f"{module} imports {name} ({layer.name} may not)")
        if _within(module, CORES) and not _within(module, TORCH_CORES):
            found += [f"{module} imports {name} (only {', '.join(TORCH_CORES)} may load torch)"
                      for name in sorted(imports) if _within(name, ("torch",))]
        if module.startswith("cascade.api.") and module.endswith("_routes"):
            found += [f"{module} imports {name} (a route module imports no other route module)"
                      for name in sorted(every) if name.startswith("cascade.api.") and name.endswith("_routes")
                      and not name.startswith(module)]
    return sorted(set(found))


def test_every_layer_imports_only_what_it_may() -> None:
    assert violations(_modules()) == []


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("cascade.api.bad_routes", "from vllm import SamplingParams\n", "cascade.api.bad_routes imports vllm"),
    ("cascade.api.bad_routes", "def f():\n    import torch\n", "cascade.api.bad_routes imports torch"),
    ("cascade.api.bad_routes", "from cascade.vllm_compat import request_keys\n", "imports cascade.vllm_compat"),
    ("cascade.api.bad_routes", "from cascade.api.kcbs_routes import router\n", "no other route module"),
    ("cascade.api.bad_routes", "from cascade.api import kcbs_routes\n", "no other route module"),
    ("cascade.kcbs.bad", "from cascade.engine.manager import EngineManager\n", "imports cascade.engine.manager"),
    ("cascade.predict.bad", "import torch\n", "only cascade.codec.exact may load torch"),
    ("cascade.export.bad", "from ..engine import types\n", "imports cascade.engine"),
    ("cascade.engine.bad", "from cascade.api.errors import APIError\n", "imports cascade.api.errors"),
    ("cascade.vllm_compat.bad", "import fastapi\n", "imports fastapi"),
    ("cascade.lifecycle_bad", "import cascade_client\n", "imports cascade_client"),
    ("cascade_common.bad", "import numpy\n", "imports numpy"),
    ("cascade_client.bad", "from cascade.settings import Settings\n", "imports cascade.settings"),
])
def test_a_forbidden_import_is_reported(tmp_path: Path, module: str, source: str, expected: str) -> None:
    path = tmp_path / "bad.py"
    path.write_text(source)
    found = violations({module: path})
    assert any(expected in line for line in found), found


def test_importing_the_app_loads_neither_torch_nor_vllm() -> None:
    """The gateway's HTTP layer starts without the engine stack; engines and the codec load it later."""
    probe = ("import sys, cascade.app; loaded = sorted(m for m in ('torch', 'vllm') if m in sys.modules); "
             "print(','.join(loaded))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": f"{SERVICE}:{CLIENTS}", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
