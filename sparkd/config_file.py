"""Where the config file is, and the little of it a command that only talks to the daemon needs.

Standard library only, and little of it: `sparkd status` and the control commands read the
daemon's address from here without loading the settings model (pydantic) or anything that speaks
SSH, and paths stay strings (`pathlib` and `dataclasses` cost a status command more than a
third of its own time: bench `probe`).
"""

from __future__ import annotations

import os
import tomllib

DEFAULT_CONFIG_PATH = "/etc/sparkd/sparkd.toml"
DEFAULT_LISTEN = "127.0.0.1:9810"
# Where the daemon's API socket is when `[daemon] socket` is unset: `api.sock` in the unit's
# RuntimeDirectory (systemd/sparkd.service: /run/sparkd).
SOCKET_NAME = "api.sock"
DEFAULT_SOCKET = f"/run/sparkd/{SOCKET_NAME}"
# A Unix socket's path: sun_path holds 108 bytes, the last a NUL (unix(7)).
MAX_SOCKET_PATH = 107


def config_path(explicit: str | os.PathLike[str] | None = None) -> str:
    if explicit is not None:
        return os.fspath(explicit)
    return os.environ.get("SPARKD_CONFIG", DEFAULT_CONFIG_PATH)


class DaemonAddress:
    __slots__ = ("control_token_file", "listen", "socket")

    def __init__(
        self,
        listen: str = DEFAULT_LISTEN,
        control_token_file: str | None = None,
        socket: str | None = DEFAULT_SOCKET,
    ) -> None:
        self.listen = listen
        self.control_token_file = control_token_file
        self.socket = socket

    def __repr__(self) -> str:
        return (
            f"DaemonAddress(listen={self.listen!r}, control_token_file="
            f"{self.control_token_file!r}, socket={self.socket!r})"
        )


def daemon_address(path: str | os.PathLike[str]) -> DaemonAddress:
    """`[daemon] listen`, `control_token_file` and `socket` as the settings read them (the
    environment's `SPARKD_DAEMON__LISTEN`, `..._CONTROL_TOKEN_FILE` and `..._SOCKET` first, then
    the file); the defaults when the file cannot be read. The daemon validates the rest."""
    table: dict[str, object] = {}
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
        daemon = document.get("daemon")
        if isinstance(daemon, dict):
            table = daemon
    except (OSError, ValueError, RecursionError):
        pass
    env = {name.upper(): value for name, value in os.environ.items()}
    listen = env.get("SPARKD_DAEMON__LISTEN", table.get("listen"))
    token = env.get("SPARKD_DAEMON__CONTROL_TOKEN_FILE", table.get("control_token_file"))
    socket = env.get("SPARKD_DAEMON__SOCKET", table.get("socket"))
    return DaemonAddress(
        listen=listen if isinstance(listen, str) and ":" in listen else DEFAULT_LISTEN,
        control_token_file=token if isinstance(token, str) and token else None,
        socket=(socket or None) if isinstance(socket, str) else DEFAULT_SOCKET,
    )
