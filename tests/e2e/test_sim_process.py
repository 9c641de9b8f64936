"""`sparkd sim` as its own process: what it prints is a config a daemon can run as it is (given
sparkd's spec hashes by its caller: the simulator imports nothing of sparkd's)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.settings import load_settings
from sparkd.shell.ssh import SshPool

# `sparkd sim` hands the simulator sparkd's own spec hashes: its healthy world has no drift.
SIM = ("-m", "sparkd.cli", "sim")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=[2, 3], ids=["2-hosts", "3-hosts"])
async def healthy_sim(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Path]:
    """With 3 hosts, each worker's spec label carries its own data IP."""
    directory = tmp_path / "world"
    hosts = str(request.param)
    process = await asyncio.create_subprocess_exec(
        sys.executable, *SIM, "--scenario", "healthy", "--dir", str(directory),
        "--first-address", "127.66.0.2", "--no-noisy-logs", "--hosts", hosts,
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        async with asyncio.timeout(60):
            while not (line := await process.stdout.readline()).startswith(b"Ctrl-C"):
                assert line, "sparkd sim exited before its world was up"
        yield directory / "sparkd.toml"
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


async def test_healthy_world_is_drift_free_for_the_config_it_prints(
    healthy_sim: Path, tmp_path: Path
) -> None:
    cluster = load_settings(healthy_sim).clusters[0]
    assert cluster.hosts[0].address == "127.66.0.2"
    pool = SshPool()
    try:
        controller = Controller(cluster, pool, StateDir(tmp_path / "state"), watch_events=False)
        for _ in range(100):
            plan = await controller.cycle()
            assert plan.actions == (), plan.reason
            if plan.phase == "healthy":
                break
            await asyncio.sleep(0.1)
        assert plan.phase == "healthy", plan.reason
    finally:
        await pool.close()
