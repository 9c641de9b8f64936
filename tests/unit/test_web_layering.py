"""The web API and the CLI are siblings above the runtime: the API is typed against a protocol
(web.protocol), not the daemon, and the CLI shows what the API shows through runtime.status_json."""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import imported

PACKAGE = Path(__file__).resolve().parents[2] / "sparkd"
WEB = sorted((PACKAGE / "web").rglob("*.py"))
CLI = sorted([*PACKAGE.glob("cli*.py"), PACKAGE / "commands.py", *(PACKAGE / "cli").rglob("*.py")])


def test_web_never_imports_the_daemon() -> None:
    assert WEB
    for path in WEB:
        found = {n for n in imported(path) if n.startswith("sparkd.runtime.daemon")}
        assert not found, f"{path.relative_to(PACKAGE)} imports {sorted(found)}"


def test_the_cli_imports_of_the_web_layer_only_the_api_it_hands_the_daemon() -> None:
    # Its views are the runtime's (status_json): `run` composes, it does not render the web's.
    assert any(p.exists() for p in CLI)
    for path in (p for p in CLI if p.exists()):
        found = {
            n for n in imported(path) if n.startswith("sparkd.web") and n != "sparkd.web.serve"
        } - {"sparkd.web.serve.serve_api"}
        assert not found, f"{path.relative_to(PACKAGE)} imports {sorted(found)}"
