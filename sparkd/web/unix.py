"""The API on a Unix socket, for the CLI on this machine (`sparkd status` and the control
commands use it when it is there, TCP otherwise).

Who may connect: the socket is created mode 0600, owned by the daemon's user (in the unit's
RuntimeDirectory, itself 0700), and each connection's peer credentials (SO_PEERCRED, read from
the kernel, not from anything the client says) must name root or the daemon's own user; any
other peer is closed before a byte is read. The socket changes who can reach the API, not what a
request needs: the control endpoints still want the bearer token. Its connections have caps of
their own (web.guard), so a TCP client cannot crowd the CLI out, nor the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import struct
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from sparkd.config_file import SOCKET_NAME
from sparkd.settings import DaemonSettings
from sparkd.web.guard import Admission

# struct ucred: pid, uid, gid (unix(7)).
_UCRED = struct.Struct("3i")


def socket_path(daemon: DaemonSettings, environ: Mapping[str, str]) -> Path | None:
    """`daemon.socket`; unset, `api.sock` in systemd's RuntimeDirectory (the first one) when the
    unit has one; None for no socket."""
    if daemon.socket is not None:
        return Path(daemon.socket) if daemon.socket else None
    runtime = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(runtime) / SOCKET_NAME if runtime else None


def permitted_uids() -> frozenset[int]:
    return frozenset({0, os.geteuid()})


def peer_uid(transport: asyncio.BaseTransport) -> int | None:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        _, uid, _ = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
    except (OSError, struct.error):
        return None
    return int(uid)


def _in_use(path: Path) -> bool:
    """Whether a live server answers on the socket at `path` (another daemon's: not taken
    over); a stale file left by a killed daemon refuses."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return False
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class GuardedUnixSite(web.UnixSite):
    """The API's Unix socket: mode 0600, peers checked by their credentials, its own caps."""

    def __init__(self, runner: web.AppRunner, path: Path, app: web.Application) -> None:
        super().__init__(runner, str(path))
        self.socket = path
        self.admission = Admission(app, runner)
        self.permitted = permitted_uids()
        self._inode: int | None = None

    def _peer(self, transport: asyncio.BaseTransport) -> str | None:
        uid = peer_uid(transport)
        return f"uid {uid}" if uid is not None and uid in self.permitted else None

    async def start(self) -> None:
        if _in_use(self.socket):
            raise OSError(f"{self.socket} is in use by another server")
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: self.admission.protocol(self._peer), str(self.socket), backlog=self._backlog
        )
        # The umask may have let others in for a moment; the peer check holds meanwhile.
        os.chmod(self.socket, 0o600)
        self._inode = self.socket.stat().st_ino

    async def stop(self) -> None:
        await super().stop()
        with contextlib.suppress(OSError):
            # Only the file this site made: a later daemon's socket is left alone.
            if self._inode is not None and self.socket.stat().st_ino == self._inode:
                self.socket.unlink()
