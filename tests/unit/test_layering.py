"""The functional core stays pure: no I/O libraries, no clock, no printing or reading.

Who may import whom (the layers, the simulator independent) is import-linter's: the contracts in
pyproject.toml, run by `make lint`; cycles are tests/unit/test_import_cycles.py's."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.imports import imported

PACKAGE = Path(__file__).resolve().parents[2] / "sparkd"
ROOT = PACKAGE.parent
PURE = sorted((PACKAGE / "core").glob("*.py")) + sorted((PACKAGE / "model").glob("*.py"))
FORBIDDEN_MODULES = {
    "asyncio",
    "asyncssh",
    "aiohttp",
    "prometheus_client",
    "apscheduler",
    "pydantic_settings",
    "sdnotify",
    "socket",
    "subprocess",
    "time",
    "datetime",
    "random",
    "os",
    "structlog",
    "requests",
    "urllib",
    "http",
    "threading",
}
FORBIDDEN_CALLS = {"open", "print", "input"}


@pytest.mark.parametrize("path", PURE, ids=[p.relative_to(PACKAGE).as_posix() for p in PURE])
def test_pure_modules(path: Path) -> None:
    for name in imported(path):
        assert name.split(".")[0] not in FORBIDDEN_MODULES, f"{path.name} imports {name}"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{path.name} calls {node.func.id}()"


# What the pure layers must not bring in even indirectly: the config's loading (pydantic-settings'
# TOML source, APScheduler reading crons) and every library that talks to the world.
NOT_LOADED = (
    "sparkd.settings",
    "pydantic_settings",
    "apscheduler",
    "asyncssh",
    "aiohttp",
    "prometheus_client",
    "structlog",
)


def test_the_pure_layers_load_no_config_loading_and_no_io_library() -> None:
    names = [f"sparkd.{p.parent.name}.{p.stem}" for p in PURE if p.stem != "__init__"]
    code = (
        f"import importlib, json, sys\nfor name in {names!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {NOT_LOADED!r} "
        f"or m.startswith('sparkd.settings'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = json.loads(out.stdout)
    assert loaded == [], f"importing core and model loads {loaded}"
