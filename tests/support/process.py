"""sparkd as a process of its own (`sparkd run`, the other commands): started, asked for its
/status, waited on, heard on its notify socket."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


async def status(port: int) -> dict[str, Any]:
    """The /status of the daemon at `port`, or {} while it does not answer."""
    try:
        timeout = aiohttp.ClientTimeout(total=2)
        async with (
            aiohttp.ClientSession(timeout=timeout) as s,
            s.get(f"http://127.0.0.1:{port}/status") as r,
        ):
            body = await r.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


class SparkdRun:
    """One `sparkd run` process on `config` with a JSON log appended to `log`, its API on
    127.0.0.1:`port`: started, signalled, stopped, its /status and its log's events read."""

    def __init__(self, config: Path, log: Path, port: int) -> None:
        self.config = config
        self.log = log
        self.port = port
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await start_daemon(self.config, self.log, {"SPARKD_DAEMON__LOG_FORMAT": "json"})

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> float:
        """Send `sig`; when it went (wall clock, as the log's timestamps)."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        return time.time()

    async def exited(self, within: float) -> None:
        assert self.proc is not None
        await asyncio.wait_for(self.proc.wait(), within)

    async def stop(self, within: float = 20.0) -> None:
        """SIGTERM (after SIGCONT, should a test have stopped it), SIGKILL past `within`."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), within)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    async def status(self) -> dict[str, Any]:
        return await status(self.port)

    async def role(self, cluster: str) -> str | None:
        """Its HA role for `cluster` as its /status says, None while it says none."""
        ha = (await self.status()).get("ha") or {}
        claim = (ha.get("clusters") or {}).get(cluster) or {}
        role = claim.get("role")
        return None if role is None else str(role)

    def events(self) -> list[dict[str, Any]]:
        """Every JSON event in its log so far (lines that are not one are skipped)."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            start = line.find("{")
            if start < 0:
                continue
            try:
                event = json.loads(line[start:])
            except ValueError:
                continue
            if isinstance(event, dict):
                found.append(event)
        return found


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
