"""Fixtures for the simulated world: a world per test, real SSH clients to its hosts."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from sparkd_sim.timing import Timing
from sparkd_sim.world import World

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


async def connect(
    world: World, host: str, connect_timeout: float = 5
) -> asyncssh.SSHClientConnection:
    h = world.hosts[host]
    return await asyncssh.connect(
        h.address,
        h.port,
        username=world.user,
        client_keys=[str(world.client_key_path)],
        known_hosts=str(world.known_hosts_path),
        config=None,
        connect_timeout=connect_timeout,
    )


@dataclass(frozen=True)
class Result:
    exit_status: int | None
    stdout: str
    stderr: str


async def run(conn: asyncssh.SSHClientConnection, command: str, input: str | None = None) -> Result:
    done = await conn.run(command, timeout=10, input=input)
    return Result(done.exit_status, str(done.stdout or ""), str(done.stderr or ""))


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float = 15.0, poll: float = 0.02
) -> None:
    """Poll `check` until it holds; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(poll)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as w:
        yield w


@pytest.fixture
async def head(world: World) -> AsyncIterator[asyncssh.SSHClientConnection]:
    async with await connect(world, "spark-a") as conn:
        yield conn


@pytest.fixture
async def worker(world: World) -> AsyncIterator[asyncssh.SSHClientConnection]:
    async with await connect(world, "spark-b") as conn:
        yield conn


async def http(
    conn: asyncssh.SSHClientConnection,
    host: str,
    port: int,
    method: str,
    path: str,
    body: dict[str, object] | None = None,
) -> tuple[int, str]:
    """One HTTP/1.1 request through its own direct-tcpip channel; (status, body)."""
    reader, writer = await conn.open_connection(host, port)
    payload = json.dumps(body).encode() if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    header, _, content = raw.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in header.lower():
        content = _dechunk(content)
    return status, content.decode()


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return out
