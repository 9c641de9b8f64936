"""systemd's notify protocol, spoken to a real datagram socket by a daemon process."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

from sparkd.sim.world import World
from tests.e2e.conftest import eventually, free_port, write_fast_config


async def test_ready_status_watchdog_reloading_stopping(seed_world: World, tmp_path: Path) -> None:
    port = free_port()
    config = write_fast_config(seed_world, tmp_path / "sparkd.toml", tmp_path / "state", port)
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    received: list[str] = []
    loop = asyncio.get_running_loop()

    def drain() -> None:
        while True:
            try:
                received.append(sock.recv(4096).decode("latin-1"))
            except BlockingIOError:
                return

    loop.add_reader(sock.fileno(), drain)
    env = {**os.environ, "NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"}
    log = (tmp_path / "daemon.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sparkd.cli", "run", "--config", str(config),
        stdout=log, stderr=log, env=env,
    )  # fmt: skip
    try:
        await eventually(lambda: any(m.startswith("READY=1") for m in received), within=20)
        await eventually(lambda: sum(m == "WATCHDOG=1" for m in received) >= 3, within=10)
        await eventually(
            lambda: any(m.startswith("STATUS=sparks: healthy") for m in received), within=40
        )
        proc.send_signal(signal.SIGHUP)
        await eventually(lambda: any(m.startswith("RELOADING=1") for m in received), within=10)
        reloading = next(m for m in received if m.startswith("RELOADING=1"))
        assert "MONOTONIC_USEC=" in reloading
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        await asyncio.sleep(0.1)
        drain()
    finally:
        loop.remove_reader(sock.fileno())
        sock.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "STOPPING=1" in received
    ready = received.index(next(m for m in received if m.startswith("READY=1")))
    assert all(not m.startswith("STATUS=sparks") for m in received[:ready])
