"""sparkd as a process of its own (`sparkd run`, the other commands): started, asked for its
/status, waited on."""

from __future__ import annotations

import asyncio
import os
import sys
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


async def start_daemon(config: Path, log: Path) -> asyncio.subprocess.Process:
    handle = log.open("ab")
    return await asyncio.create_subprocess_exec(
        *SPARKD, "run", "--config", str(config), stdout=handle, stderr=handle,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
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
