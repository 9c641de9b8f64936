"""systemd's notify protocol, spoken to a real datagram socket by a daemon process."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import time
from pathlib import Path

import aiohttp

from sparkd_sim.world import World
from tests.support.daemon import eventually, fast_config_in
from tests.support.process import NotifySocket, start_daemon


async def notified(
    config: Path, directory: Path, watchdog: float
) -> tuple[NotifySocket, asyncio.subprocess.Process]:
    """`sparkd run` on `config` as systemd starts it: told of a notify socket (in `directory`,
    watched from now on) and of a watchdog of `watchdog` seconds; its log in `directory`."""
    notify = NotifySocket(directory / "notify.sock")
    notify.watch()
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(int(watchdog * 1e6))}
    return notify, await start_daemon(config, directory / "daemon.log", env)


async def test_ready_status_watchdog_reloading_stopping(seed_world: World, tmp_path: Path) -> None:
    config, _ = fast_config_in(seed_world, tmp_path)
    notify, proc = await notified(config, tmp_path, watchdog=0.4)
    received = notify.received
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
        notify.drain()
    finally:
        notify.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "STOPPING=1" in received
    ready = received.index(next(m for m in received if m.startswith("READY=1")))
    assert all(not m.startswith("STATUS=sparks") for m in received[:ready])


async def test_a_hung_host_within_its_timeouts_keeps_the_watchdog_fed(
    healthy_world: World, tmp_path: Path
) -> None:
    # command_timeout 8 s at a 1 s interval: a look at a silent host lasts 8 intervals, as
    # check-config allows (120 s at 30 s).
    config, port = fast_config_in(healthy_world, tmp_path)
    config.write_text(
        re.sub(r"^(\s*)command_timeout = .*$", r"\1command_timeout = 8.0", config.read_text(),
               flags=re.M)
    )  # fmt: skip
    # systemd restarts the unit when no ping comes for WATCHDOG_USEC; sparkd pings at half.
    limit = 2.0
    notify, proc = await notified(config, tmp_path, watchdog=limit)
    pings = notify.pings
    try:
        await eventually(lambda: healthy(port), within=30)
        await eventually(lambda: len(pings) >= 2, within=10)
        hung_at = time.monotonic()
        await healthy_world.fault("blackhole", "spark-b")
        await eventually(lambda: reported_hung(port), within=30, poll=0.2)
        seen_at = time.monotonic()
    finally:
        notify.close()
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    # The look that met the silent host outlasted 3 intervals, so this is the case at stake.
    assert seen_at - hung_at > 3 * 1.0
    during = [hung_at, *(t for t in pings if hung_at <= t <= seen_at), seen_at]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert max(gaps) < limit, gaps


async def cluster_status(port: int) -> dict:  # type: ignore[type-arg]
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/status") as r:
            body = await r.json()
    except aiohttp.ClientError:
        return {}
    clusters = body.get("clusters") or [{}]
    return clusters[0]  # type: ignore[no-any-return]


async def healthy(port: int) -> bool:
    return (await cluster_status(port)).get("phase") == "healthy"


async def reported_hung(port: int) -> bool:
    return "spark-b" in json.dumps((await cluster_status(port)).get("reason", ""))
