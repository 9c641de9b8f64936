"""A watch whose start revision etcd has compacted ends instead of
hanging, and a standby whose watch hit compaction re-lists at its renewals and still takes
over (against a real etcd)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from sparkd.ha.etcd import EtcdClient
from sparkd.ha.ownership import Ownership
from tests.etcd.conftest import EtcdServer
from tests.support.ha import spec, wait_for

pytestmark = pytest.mark.etcd


async def compact(etcd: EtcdServer, admin: EtcdClient, writes: int = 5) -> int:
    """Move the revision on and compact etcd's history up to it; the revision compacted to."""
    revision = 0
    for n in range(writes):
        revision = await admin.put("test/v1/churn", str(n).encode())
    async with aiohttp.ClientSession() as http:
        body = {"revision": str(revision), "physical": True}
        async with http.post(f"{etcd.url}/v3/kv/compaction", json=body) as response:
            assert response.status == 200, await response.text()
    return revision


async def test_a_watch_from_a_compacted_revision_ends(etcd: EtcdServer, admin: EtcdClient) -> None:
    await compact(etcd, admin)
    seen = []

    async def drain() -> None:
        async for change in admin.watch("test/v1/", 1):
            seen.append(change)

    # It ends by itself (the caller re-lists), well before the test would give up on it.
    await asyncio.wait_for(drain(), 10)
    assert seen == []


async def test_a_standby_whose_watch_hit_compaction_still_takes_over(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"])
    b = Ownership(spec(etcd, "b"), ["c1"])
    await a.round()
    old = a.token("c1")
    await b.round()
    # The standby's watch starts from a revision etcd no longer holds.
    stale = b.revision
    compacted = await compact(etcd, admin)
    assert stale < compacted
    b.revision = stale
    b.start()
    try:
        await wait_for(lambda: b.revision > compacted, 10)  # its renewals re-listed
        await a.stop()  # released: the owner key is deleted
        await wait_for(lambda: b.may_act("c1"), 3 + 1.5)
        token = b.token("c1")
        assert old is not None and token is not None and token > old
    finally:
        await b.stop()
