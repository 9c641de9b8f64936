"""sparkd as a process of its own (`sparkd run`, the other commands): started, asked for its
/status, waited on, heard on its notify socket."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tests.support.daemon import eventually

SPARKD = [sys.executable, "-m", "sparkd.cli"]


async def sparkd(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *SPARKD, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def start_daemon(
    config: Path, log: Path, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """`sparkd run` on `config`, its output appended to `log`, `env` added to its environment."""
    handle = log.open("ab")
    return await asyncio.create_subprocess_exec(
        *SPARKD, "run", "--config", str(config), stdout=handle, stderr=handle,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )  # fmt: skip


async def status(port: int) -> dict:  # type: ignore[type-arg]
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/status") as r:
            return await r.json()  # type: ignore[no-any-return]
    except aiohttp.ClientError:
        return {}


def phase(body: dict) -> str | None:  # type: ignore[type-arg]
    clusters = body.get("clusters") or []
    return clusters[0]["phase"] if clusters else None


async def wait_phase(port: int, want: str | None, within: float) -> None:
    """Until the daemon at `port` reports phase `want` in /status (None: any phase, it is up)."""

    async def seen() -> bool:
        got = phase(await status(port))
        return got is not None if want is None else got == want

    await eventually(seen, within=within)


class NotifySocket:
    """A datagram socket standing in for systemd's; NOTIFY_SOCKET points at it. Each message as
    it arrives, and the monotonic times of the watchdog pings among them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.received: list[str] = []
        self.pings: list[float] = []

    def drain(self) -> list[str]:
        while True:
            try:
                message = self.sock.recv(4096).decode("latin-1")
            except BlockingIOError:
                return self.received
            self.received.append(message)
            if message == "WATCHDOG=1":
                self.pings.append(time.monotonic())

    def watch(self) -> None:
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self.drain)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()

    def after(self, index: int, prefix: str) -> int | None:
        """The index of the first message from `index` on that starts with `prefix`."""
        for position in range(index, len(self.received)):
            if self.received[position].startswith(prefix):
                return position
        return None


async def killed_once(
    config: Path, log: Path, check: Callable[[], bool], within: float, poll: float = 0.05
) -> None:
    """`sparkd run` on `config` until `check` holds, then SIGKILL: no chance to tidy up."""
    proc = await start_daemon(config, log)
    try:
        await eventually(check, within=within, poll=poll)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


async def run_until_healthy(config: Path, log: Path, port: int, within: float) -> None:
    """`sparkd run` on `config` until its /status at `port` shows the cluster healthy, then
    SIGTERM, on which it exits 0."""
    proc = await start_daemon(config, log)
    try:
        await wait_phase(port, "healthy", within=within)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
