"""An etcd endpoint (or anyone on the path to an `http://` one) that answers without end: the
client reads at most MAX_ANSWER bytes of any answer or watch message, then gives up on that
endpoint as after a reset, and the caller sees the usual etcd failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from sparkd.ha import etcd
from sparkd.ha.etcd import EtcdClient, EtcdUnavailable

# Far past the cap: a client reading it whole would hold 64 MiB more than the cap allows.
FLOOD = 64 << 20
CHUNK = b"x" * (1 << 20)
# Bytes the server got written, per test.
SENT = web.AppKey("sent", list[int])


async def endless(request: web.Request) -> web.StreamResponse:
    """A 200 whose body never stops within FLOOD bytes; no Content-Length (chunked)."""
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    await response.prepare(request)
    for _ in range(FLOOD // len(CHUNK)):
        try:
            await response.write(b'{"kvs": ["' + CHUNK if _ == 0 else CHUNK)
        except (ConnectionResetError, RuntimeError):
            break
        request.app[SENT][0] += len(CHUNK)
    return response


async def declared(request: web.Request) -> web.Response:
    """A body whose Content-Length alone says it is too large."""
    return web.Response(body=b" " * (etcd.MAX_ANSWER + 1), content_type="application/json")


async def watch_flood(request: web.Request) -> web.StreamResponse:
    """One watch message (a line) that never ends."""
    return await endless(request)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, web.Application]]:
    app = web.Application()
    app[SENT] = [0]
    app.router.add_post("/v3/kv/range", endless)
    app.router.add_post("/v3/kv/txn", declared)
    app.router.add_post("/v3/watch", watch_flood)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


async def test_an_endless_answer_is_an_unavailable_etcd(
    server: tuple[str, web.Application],
) -> None:
    endpoint, app = server
    client = EtcdClient([endpoint], timeout=20)
    try:
        with pytest.raises(EtcdUnavailable) as failed:
            await client.call("kv/range", {"key": "eA=="})
    finally:
        await client.close()
    assert "AnswerTooLarge" in str(failed.value)
    # The client stopped reading near the cap, not at the end of the flood.
    assert app[SENT][0] < FLOOD // 2


async def test_a_declared_too_large_answer_is_refused_unread(
    server: tuple[str, web.Application],
) -> None:
    endpoint, _ = server
    client = EtcdClient([endpoint], timeout=20)
    try:
        with pytest.raises(EtcdUnavailable, match="AnswerTooLarge"):
            await client.call("kv/txn", {})
    finally:
        await client.close()


async def test_a_watch_message_without_end_ends_the_watch(
    server: tuple[str, web.Application],
) -> None:
    endpoint, app = server
    client = EtcdClient([endpoint], timeout=20)
    try:
        with pytest.raises(etcd.AnswerTooLarge):
            async with asyncio.timeout(60):
                async for _ in client.watch("sparkd/", 1):
                    pass
    finally:
        await client.close()
    assert app[SENT][0] < FLOOD // 2
