"""`sparkd status`, `pause`, `resume`, `reconcile`: the daemon's HTTP API only, on a lean start
(no SSH library, no settings model, no HTTP client library)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.toy import EXAMPLE_CONFIG, ROOT

HEAVY = ("asyncssh", "pydantic", "pydantic_settings", "aiohttp", "sparkd.settings")
STATUS = {
    "clusters": [
        {
            "cluster": "sparks",
            "phase": "healthy",
            "reason": "probe reasoning_only in 0.12s, 50 completion tokens",
            "snapshot": {
                "ray": {"gpus_total": 2},
                "endpoint": {"status": "up", "health_status": 200},
            },
        }
    ]
}


class Daemon(ThreadingHTTPServer):
    requests: list[tuple[str, str, dict[str, str], Any]]


class Handler(BaseHTTPRequestHandler):
    server: Daemon

    def _answer(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path, dict(self.headers), None))
        self._answer(STATUS)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.requests.append(("POST", self.path, dict(self.headers), body))
        self._answer({"persisted": True})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    server = Daemon(("127.0.0.1", 0), Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def config_for(tmp_path: Path, port: int, token: Path | None = None) -> Path:
    text = EXAMPLE_CONFIG.read_text().replace(
        'listen = "127.0.0.1:9810"', f'listen = "127.0.0.1:{port}"'
    )
    if token is not None:
        text = text.replace("[daemon]\n", f'[daemon]\ncontrol_token_file = "{token}"\n', 1)
    path = tmp_path / "sparkd.toml"
    path.write_text(text)
    return path


def sparkd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    environ.pop("SPARKD_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sparkd.cli", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )


def imported(stderr: str) -> set[str]:
    """Every module `-X importtime` reported loading."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY)))


def test_status_loads_no_ssh_library_and_no_settings_model(daemon: Daemon, tmp_path: Path) -> None:
    config = config_for(tmp_path, daemon.server_address[1])
    result = sparkd("status", "--config", str(config))
    assert result.returncode == 0, result.stderr[-2000:]
    modules = imported(result.stderr)
    assert "sparkd.cli.api" in modules
    assert heavy(modules) == []


def test_status_reads_the_daemons_address_from_the_config(daemon: Daemon, tmp_path: Path) -> None:
    config = config_for(tmp_path, daemon.server_address[1])
    result = sparkd("status", "--config", str(config))
    assert result.returncode == 0, result.stderr[-2000:]
    header, row = result.stdout.splitlines()
    assert header.split()[:3] == ["CLUSTER", "PHASE", "GPUS"]
    assert row.split()[:4] == ["sparks", "healthy", "2", "serving"]
    assert [(m, p) for m, p, _, _ in daemon.requests] == [("GET", "/status")]
    as_json = sparkd("status", "--config", str(config), "--json")
    assert json.loads(as_json.stdout) == STATUS


def test_the_environment_names_the_address_before_the_file(daemon: Daemon, tmp_path: Path) -> None:
    config = config_for(tmp_path, 9)  # nothing listens there
    port = daemon.server_address[1]
    env = {"SPARKD_DAEMON__LISTEN": f"127.0.0.1:{port}", "SPARKD_CONFIG": str(config)}
    result = sparkd("status", "--config", str(config), env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert daemon.requests


def test_an_unreachable_daemon_is_exit_69(tmp_path: Path) -> None:
    config = config_for(tmp_path, 9)
    result = sparkd("status", "--config", str(config))
    assert result.returncode == 69
    assert "sparkd status: cannot reach the daemon at http://127.0.0.1:9" in result.stderr


def test_pause_sends_the_token_and_what_it_was_asked(daemon: Daemon, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("ctl-0123456789abcdef\n")
    token.chmod(0o600)
    config = config_for(tmp_path, daemon.server_address[1], token)
    result = sparkd(
        "pause", "sp arks", "--reason", "cable swap", "--for", "30m", "--config", str(config)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "sp arks: pause done"
    [(method, path, headers, body)] = daemon.requests
    assert (method, path) == ("POST", "/clusters/sp%20arks/pause")
    assert headers["Authorization"] == "Bearer ctl-0123456789abcdef"
    assert body["reason"] == "cable swap" and body["for_seconds"] == 1800.0
    # A duration is read without the config schema: `--for` costs no pydantic.
    assert heavy(imported(result.stderr)) == []
    resumed = sparkd("resume", "sparks", "--config", str(config))
    assert resumed.returncode == 0 and daemon.requests[-1][1] == "/clusters/sparks/resume"
    assert heavy(imported(resumed.stderr)) == []
