"""The API on a Unix socket (`daemon.socket`): a `sparkd run` process serves it, `sparkd status`
and the control commands use it when it is there (TCP otherwise), and a peer whose credentials
name neither root nor the daemon's user is closed unanswered."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkd_sim.world import World
from tests.support.daemon import eventually, free_port, write_fast_config
from tests.support.process import sparkd, start_daemon, wait_phase

NOBODY = 65534
# The peer's interpreter: one another user may run (the test's may live under /root).
SYSTEM_PYTHON = "/usr/bin/python3"
# A peer's request on the socket, from a process of its own (run as another user below).
PEER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
data = b""
try:  # a refused peer may find the socket closed before it has even sent
    s.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n")
    while chunk := s.recv(4096):
        data += chunk
except OSError:
    pass
print(data.split(b"\\r\\n", 1)[0].decode() or "closed")
"""


@dataclass
class Running:
    proc: asyncio.subprocess.Process
    port: int
    config: Path
    socket: Path
    tmp: Path


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short path (a socket's is at most 107 bytes) that other users may traverse, so the
    socket's own mode and the peer check are what is tried."""
    directory = Path(tempfile.mkdtemp(prefix="sparkd-sock-", dir="/tmp"))
    directory.chmod(0o711)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def running(healthy_world: World, tmp_path: Path, socket_dir: Path) -> AsyncIterator[Running]:
    port = free_port()
    path = socket_dir / "api.sock"
    config = write_fast_config(healthy_world, tmp_path / "sparkd.toml", tmp_path / "state", port)
    with_socket(config, config, path)
    log = tmp_path / "daemon.log"
    proc = await start_daemon(config, log)
    try:
        await wait_phase(port, None, within=20)
        yield Running(proc, port, config, path, tmp_path)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
    assert "Traceback" not in log.read_text()
    assert not path.exists()  # removed at stop


def with_socket(source: Path, target: Path, path: Path | str, port: int | None = None) -> Path:
    """`source`'s config with `daemon.socket` set (and `listen` on `port`), written to `target`."""
    text = re.sub(r"^socket = .*\n", "", source.read_text(), flags=re.M)
    text = text.replace("[daemon]\n", f'[daemon]\nsocket = "{path}"\n', 1)
    if port is not None:
        text = re.sub(r"^listen = .*$", f'listen = "127.0.0.1:{port}"', text, flags=re.M)
    target.write_text(text)
    return target


async def test_status_uses_the_socket_when_tcp_is_unreachable(running: Running) -> None:
    assert stat.S_IMODE(running.socket.stat().st_mode) == 0o600
    # The CLI's config names a port nothing listens on: only the socket can answer.
    dead = with_socket(running.config, running.tmp / "cli.toml", running.socket, free_port())
    code, out, err = await sparkd("status", "--config", str(dead))
    assert code == 0, err
    assert "sparks" in out
    code, out, err = await sparkd("status", "--json", "--config", str(dead))
    assert code == 0 and '"clusters"' in out, err


async def test_without_the_socket_the_cli_falls_back_to_tcp(running: Running) -> None:
    missing = running.tmp / "none.sock"
    config = with_socket(running.config, running.tmp / "cli.toml", missing, running.port)
    code, out, err = await sparkd("status", "--config", str(config))
    assert code == 0 and "sparks" in out, err
    # Neither there: unreachable, as before.
    dead = with_socket(running.config, running.tmp / "dead.toml", missing, free_port())
    code, _, err = await sparkd("status", "--config", str(dead))
    assert code != 0 and "cannot reach the daemon" in err


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason="running a peer as another user needs root and a system python",
)
async def test_a_peer_of_another_user_is_closed_unanswered(running: Running) -> None:
    def peer(user: int | None) -> str:
        """What the peer read: the status line, `closed`, or (when it could not connect) the
        last line of its error."""
        done = subprocess.run(
            [SYSTEM_PYTHON, "-c", PEER, str(running.socket)],
            capture_output=True,
            text=True,
            timeout=30,
            user=user,
            check=False,
        )
        return done.stdout.strip() or done.stderr.strip().splitlines()[-1]

    assert peer(None) == "HTTP/1.1 200 OK"
    # The file's mode keeps another user out...
    assert peer(NOBODY) == "PermissionError: [Errno 13] Permission denied"
    # ...and with the mode opened, the peer check still does.
    running.socket.chmod(0o666)
    assert peer(NOBODY) == "closed"
    await eventually(lambda: running.proc.returncode is None)
    assert peer(None) == "HTTP/1.1 200 OK"
