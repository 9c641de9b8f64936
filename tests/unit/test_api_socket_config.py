"""`daemon.socket`: where the API's Unix socket is, as the daemon and the CLI read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.config_file import DEFAULT_SOCKET, daemon_address
from sparkd.settings import load_settings
from sparkd.web.unix import socket_path
from tests.support.config import BASE, problems, write


def with_socket(value: str) -> str:
    return BASE.replace("[daemon]\n", f'[daemon]\nsocket = "{value}"\n', 1)


def test_the_socket_is_an_absolute_path_a_socket_can_have(tmp_path: Path) -> None:
    assert any("daemon.socket" in p for p in problems(tmp_path, with_socket("run/api.sock")))
    long = "/run/" + "s" * 110
    assert any("107 bytes" in p for p in problems(tmp_path, with_socket(long)))
    assert load_settings(write(tmp_path, with_socket(""))).daemon.socket == ""


def test_where_the_daemon_makes_its_socket(tmp_path: Path) -> None:
    unset = load_settings(write(tmp_path, BASE)).daemon
    assert socket_path(unset, {}) is None
    runtime = {"RUNTIME_DIRECTORY": "/run/sparkd:/run/other"}
    assert socket_path(unset, runtime) == Path("/run/sparkd/api.sock") == Path(DEFAULT_SOCKET)
    assert socket_path(load_settings(write(tmp_path, with_socket(""))).daemon, runtime) is None
    chosen = load_settings(write(tmp_path, with_socket("/srv/s.sock"))).daemon
    assert socket_path(chosen, runtime) == Path("/srv/s.sock")


def test_where_the_cli_looks_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKD_DAEMON__SOCKET", raising=False)
    assert daemon_address(write(tmp_path, BASE)).socket == DEFAULT_SOCKET
    assert daemon_address(write(tmp_path, with_socket(""))).socket is None
    assert daemon_address(write(tmp_path, with_socket("/srv/s.sock"))).socket == "/srv/s.sock"
    monkeypatch.setenv("SPARKD_DAEMON__SOCKET", "/srv/env.sock")
    assert daemon_address(write(tmp_path, BASE)).socket == "/srv/env.sock"
