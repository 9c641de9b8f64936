"""The HTTP API of a `sparkd run` process under abuse, over loopback: a slowloris, oversized and
deeply nested bodies, header bytes that are not UTF-8, a foreign Host, silly durations."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from sparkd.web.guard import HEADER_TIMEOUT, MAX_CONNECTIONS, MAX_PER_PEER
from sparkd_sim.world import World
from tests.support.daemon import eventually, free_port, write_fast_config
from tests.support.process import sparkd, start_daemon, status, wait_phase

TOKEN = "abuse-token"


@dataclass
class Running:
    proc: asyncio.subprocess.Process
    port: int
    config: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


@pytest.fixture
async def running(healthy_world: World, tmp_path: Path) -> AsyncIterator[Running]:
    port = free_port()
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    config = write_fast_config(
        healthy_world, tmp_path / "sparkd.toml", tmp_path / "state", port, token_file=token
    )
    log = tmp_path / "daemon.log"
    proc = await start_daemon(config, log)
    try:
        await wait_phase(port, None, within=20)
        yield Running(proc, port, config, log)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
    assert "Traceback" not in log.read_text()


async def raw(port: int, request: bytes, wait: float = 10.0) -> str:
    """Send bytes as they are; the status line of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), wait)
        return line.decode("latin-1").strip()
    finally:
        writer.close()


async def post(
    url: str, body: bytes | str, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    sent = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    sent.update(headers or {})
    data = body.encode() if isinstance(body, str) else body
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=sent) as r:
        return r.status, await r.text()


async def test_slowloris_cannot_exhaust_descriptors(running: Running) -> None:
    baseline = running.fds()
    writers: list[asyncio.StreamWriter] = []
    readers: list[asyncio.StreamReader] = []
    try:
        for _ in range(3 * MAX_CONNECTIONS):
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
                writer.write(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
                readers.append(reader)
                writers.append(writer)
        await asyncio.sleep(0.5)
        assert running.fds() <= baseline + MAX_CONNECTIONS + 4
        # Trickling a byte at a time does not keep a connection: the headers have a deadline.
        for _ in range(int(HEADER_TIMEOUT) + 2):
            for writer in writers:
                with contextlib.suppress(OSError):
                    writer.write(b"a")
            await asyncio.sleep(1)
        closed = 0
        for reader in readers:
            with contextlib.suppress(OSError):
                data = await asyncio.wait_for(reader.read(), 2)
                assert not data.startswith(b"HTTP/1.1 200"), data[:40]
            closed += 1
        assert closed == len(readers)
    finally:
        for writer in writers:
            writer.close()
    await eventually(lambda: running.fds() <= baseline + 2, within=5)
    async with aiohttp.ClientSession() as s, s.get(f"{running.url}/healthz") as r:
        assert r.status == 200
    assert running.proc.returncode is None


async def test_oversized_deep_and_malformed_requests_get_4xx(running: Running) -> None:
    pause = f"{running.url}/clusters/sparks/pause"
    code, _ = await post(pause, json.dumps({"reason": "x" * 200_000}))
    assert code == 413
    deep = '{"reason": "deep", "x": ' + "[" * 5000 + "]" * 5000 + "}"
    code, text = await post(pause, deep)
    assert code == 400 and "nests deeper" in text
    nested = '{"reason": "deep", "x": ' + "[" * 40 + "]" * 40 + "}"
    code, text = await post(pause, nested)
    assert code == 400 and "nests deeper" in text
    code, _ = await post(pause, b'{"reason": "\xff\xfe"}')
    assert code == 400
    code, _ = await post(pause, '{"reason": "big", "for_seconds": ' + "9" * 5000 + "}")
    assert code == 400
    for duration in ('"3600"', "1e999", "-5", "0", "true", "1e30", "[60]"):
        code, text = await post(pause, f'{{"reason": "r", "for_seconds": {duration}}}')
        assert code == 400, (duration, code, text)
        assert "for_seconds" in text
    code, body = await post(pause, '{"reason": "window", "for_seconds": 7200}')
    assert code == 200, body
    assert json.loads(body)["persisted"] is True
    code, _ = await post(f"{running.url}/clusters/sparks/resume", "{}")
    assert code == 200

    # An Authorization header whose bytes are not UTF-8.
    status_line = await raw(
        running.port,
        b"POST /clusters/sparks/resume HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer \xff\xfe\xfd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    assert status_line.startswith("HTTP/1.1 400"), status_line

    # A body announced and never sent.
    status_line = await raw(
        running.port,
        b"POST /clusters/sparks/pause HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Authorization: Bearer {TOKEN}\r\n".encode()
        + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        wait=HEADER_TIMEOUT + 10,
    )
    assert status_line.startswith("HTTP/1.1 408"), status_line

    async with aiohttp.ClientSession() as s, s.get(f"{running.url}/healthz") as r:
        assert r.status == 200


async def test_dns_rebinding_host_is_refused(running: Running) -> None:
    async def get(host: str) -> int:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"{running.url}/status", headers={"Host": host}) as r,
        ):
            return r.status

    assert await get("rebind.attacker.example") == 421
    assert await get(f"rebind.attacker.example:{running.port}") == 421
    assert await get(f"localhost:{running.port}") == 200
    assert await get(f"127.0.0.1:{running.port}") == 200
    assert await get(f"[::1]:{running.port}") == 200
    code, _ = await post(
        f"{running.url}/clusters/sparks/pause",
        '{"reason": "r"}',
        headers={"Host": "rebind.attacker.example"},
    )
    assert code == 421
    listed = await status(running.port)
    assert listed["clusters"][0]["paused"] is None


async def test_cli_sends_cluster_names_url_encoded(running: Running) -> None:
    for name in ("sparks/../sparks", "sparks?x=1", "sp arks#1"):
        code, out, err = await sparkd(
            "pause", name, "--reason", "r", "--config", str(running.config)
        )
        assert code == 1, (name, out)
        assert f"no cluster named {name!r}" in err, err
    listed = await status(running.port)
    assert listed["clusters"][0]["paused"] is None


async def test_a_fifo_as_the_token_file_is_refused_and_the_loop_carries_on(
    running: Running,
) -> None:
    token = running.config.parent / "token"
    token.unlink()
    os.mkfifo(token)
    code, text = await asyncio.wait_for(post(f"{running.url}/clusters/sparks/pause", "{}"), 10)
    assert code == 403 and "not a regular file" in text
    async with aiohttp.ClientSession() as s, s.get(f"{running.url}/healthz") as r:
        assert r.status == 200


async def held(reader: asyncio.StreamReader) -> bool:
    """Whether the server kept the connection (a refused one is reset at once)."""
    try:
        await asyncio.wait_for(reader.read(1), 1.0)
    except TimeoutError:
        return True
    except OSError:
        return False
    return False


async def test_one_peer_cannot_hold_every_connection(running: Running) -> None:
    writers: list[asyncio.StreamWriter] = []
    readers: list[asyncio.StreamReader] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
                writer.write(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
                readers.append(reader)
                writers.append(writer)
        kept = await asyncio.gather(*(held(r) for r in readers))
        assert sum(kept) == MAX_PER_PEER
        # Another client (another loopback address) still gets in at once.
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.get(f"{running.url}/healthz") as r,
        ):
            assert r.status == 200
    finally:
        for writer in writers:
            writer.close()


async def test_half_sent_local_requests_do_not_blind_healthz(running: Running) -> None:
    """Every local client is 127.0.0.1: a peer's cap full of half-sent requests must not
    refuse the next local client; the oldest half-sent one is closed for it."""
    writers: list[asyncio.StreamWriter] = []
    readers: list[asyncio.StreamReader] = []
    try:
        for _ in range(MAX_PER_PEER):
            reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
            writer.write(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
            await writer.drain()
            readers.append(reader)
            writers.append(writer)
        assert all(await asyncio.gather(*(held(r) for r in readers)))
        answered = 0
        for _ in range(4):
            async with aiohttp.ClientSession() as s, s.get(f"{running.url}/healthz") as r:
                answered += r.status == 200
        assert answered == 4
        # The oldest half-sent requests made room, the newest are kept.
        kept = await asyncio.gather(*(held(r) for r in readers))
        assert not kept[0] and kept[-1] and kept == sorted(kept), kept
    finally:
        for writer in writers:
            writer.close()


async def test_an_events_file_turned_directory_is_a_503_not_a_traceback(running: Running) -> None:
    events = running.config.parent / "state" / "events.jsonl"
    events.unlink(missing_ok=True)
    events.mkdir()
    async with aiohttp.ClientSession() as s, s.get(f"{running.url}/events") as r:
        assert r.status == 503
        assert "events unreadable" in await r.text()
