"""The wire-format package stays dependency-free, and the service never imports the client."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "service"
FORBIDDEN = {"cascade", "cascade_client", "fastapi", "vllm", "torch", "numpy"}
CLIENT_IMPORT_ALLOWED = {SERVICE / "cascade" / "cli.py"}  # ``cascade`` launches the client's CLI


def test_cascade_common_loads_nothing_but_the_standard_library() -> None:
    code = ("import json, sys\n"
            "import cascade_common.sse, cascade_common.topk_format, cascade_common.ordered\n"
            "print(json.dumps([cascade_common.__file__, sorted({m.split('.')[0] for m in sys.modules})]))")
    env = {**os.environ, "PYTHONPATH": str(SERVICE)}
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True,
                            check=True, timeout=60)
    where, loaded = json.loads(result.stdout)
    assert Path(where).resolve().parent == SERVICE / "cascade_common"
    assert FORBIDDEN.isdisjoint(loaded), FORBIDDEN & set(loaded)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_cascade_common_imports_no_project_or_heavy_package() -> None:
    for path in (SERVICE / "cascade_common").rglob("*.py"):
        assert not {name.split(".")[0] for name in _imports(path)} & FORBIDDEN, path


def test_the_service_does_not_import_the_client() -> None:
    offenders = sorted(str(path.relative_to(ROOT)) for path in (SERVICE / "cascade").rglob("*.py")
                       if path not in CLIENT_IMPORT_ALLOWED
                       and any(name.split(".")[0] == "cascade_client" for name in _imports(path)))
    assert offenders == []
