"""The functional core stays pure: no I/O libraries, no clock, no printing or reading.

Who may import whom (the layers, the simulator independent) is import-linter's: the contracts in
pyproject.toml, run by `make lint`; cycles are tests/unit/test_import_cycles.py's."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sparkd"
ROOT = PACKAGE.parent
PURE = sorted((PACKAGE / "core").rglob("*.py")) + sorted((PACKAGE / "model").glob("*.py"))
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


def _impurities(path: Path) -> Iterator[str]:
    where = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        else:
            names = []
        for name in names:
            if name.split(".")[0] in FORBIDDEN_MODULES:
                yield f"{where}:{node.lineno} imports {name}"
        call = node.func if isinstance(node, ast.Call) else None
        if isinstance(call, ast.Name) and call.id in FORBIDDEN_CALLS:
            yield f"{where}:{call.lineno} calls {call.id}()"


def test_pure_modules_import_no_io_library_and_call_no_io_builtin() -> None:
    offences = [line for path in PURE for line in _impurities(path)]
    assert not offences, "\n".join(offences)


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
    names = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts) for p in PURE if p.stem != "__init__"
    ]
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
