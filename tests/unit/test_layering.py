"""The functional core stays pure: no I/O libraries, no clock, no reaching up the layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sparkd"
PURE = sorted((PACKAGE / "core").glob("*.py")) + sorted((PACKAGE / "model").glob("*.py"))
FORBIDDEN_MODULES = {
    "asyncio",
    "asyncssh",
    "aiohttp",
    "prometheus_client",
    "apscheduler",
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
FORBIDDEN_PACKAGES = (
    "sparkd.shell",
    "sparkd.runtime",
    "sparkd.web",
    "sparkd_sim",
    "sparkd.cli",
    "sparkd.commands",
)
FORBIDDEN_CALLS = {"open", "print", "input"}


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", PURE, ids=[p.relative_to(PACKAGE).as_posix() for p in PURE])
def test_pure_modules(path: Path) -> None:
    for name in imports(path):
        assert name.split(".")[0] not in FORBIDDEN_MODULES, f"{path.name} imports {name}"
        assert not name.startswith(FORBIDDEN_PACKAGES), f"{path.name} imports {name}"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{path.name} calls {node.func.id}()"


def test_model_does_not_import_core() -> None:
    for path in sorted((PACKAGE / "model").glob("*.py")):
        assert not any(n.startswith("sparkd.core") for n in imports(path)), path.name


ROOT = PACKAGE.parent


def _tree(name: str) -> list[Path]:
    return sorted((ROOT / name).rglob("*.py"))


@pytest.mark.parametrize("package", ["sparkd_sim"])
def test_simulator_imports_no_sparkd(package: str) -> None:
    for path in _tree(package):
        for name in imports(path):
            assert name.split(".")[0] != "sparkd", f"{path.relative_to(ROOT)} imports {name}"


def test_daemon_imports_no_simulator() -> None:
    # `sparkd sim` and `sparkd demo` reach sparkd-sim through its entry points, never an import.
    for path in _tree("sparkd"):
        for name in imports(path):
            top = name.split(".")[0]
            where = path.relative_to(ROOT)
            assert top not in ("sparkd_sim", "sparkd_demo"), f"{where} imports {name}"
