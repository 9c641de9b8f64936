"""The event journal in etcd against a real etcd: the owner's events are what every instance
reads, a new owner's follow the dead owner's, a former owner's write is refused and changes
nothing, and the journal keeps its bound."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sparkd.ha.etcd import EtcdClient
from sparkd.ha.events import events_prefix
from sparkd.runtime.ha_store import EVENTS_PER_WRITE
from sparkd.shell.secrets import read_secret
from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer
from tests.support.daemon import eventually
from tests.support.ha import (
    TTL,
    Instance,
    owner_and_standby,
    wait_for,
)
from tests.support.store_box import Box, two_boxes

pytestmark = pytest.mark.etcd

PREFIX = "test/v1/"


def event(kind: str, n: int) -> dict[str, Any]:
    return {"at": 1.7e9 + n, "cluster": "c1", "kind": kind, "n": n}


async def keys(admin: EtcdClient) -> list[tuple[str, int]]:
    found, _ = await admin.get_prefix(events_prefix(PREFIX, "c1"))
    return [(kv.key, kv.mod_revision) for kv in found]


@pytest.fixture
async def boxes(etcd: EtcdServer, tmp_path: Path) -> AsyncIterator[tuple[Box, Box]]:
    async with two_boxes(Box(etcd, "a", tmp_path), Box(etcd, "b", tmp_path)) as pair:
        yield pair


async def test_the_owners_events_are_what_the_standby_reads_and_a_new_owners_follow(
    boxes: tuple[Box, Box], admin: EtcdClient
) -> None:
    a, b = boxes
    await a.own()
    old = a.ha.token("c1")
    a.store.journal("c1", [event("phase", 1), event("remediation", 2)])
    await a.store.close()
    await b.ha.round()
    assert b.ha.role("c1") == "standby"
    # A standby's own events stay in its state dir; etcd's journal is the owner's.
    b.store.journal("c1", [event("phase", 99)])
    await b.store.close()
    read, skipped = await b.store.read_events(["c1"], 10)
    assert skipped == 0
    assert [(e["n"], e["instance"], e["token"]) for e in read] == [(2, "a", old), (1, "a", old)]
    assert read == (await a.store.read_events(["c1"], 10))[0]
    # a dies (its lease runs out); b continues the journal after a's last event.
    assert a.ha.lease is not None
    await admin.revoke(a.ha.lease)
    await b.own()
    new = b.ha.token("c1")
    assert new is not None and old is not None and new > old
    b.store.journal("c1", [event("memory_adopted", 3)])
    b.store.journal("c1", [event("fence_swept", 4)])
    await b.store.close()
    read, _ = await b.store.read_events(["c1"], 10)
    assert [(e["n"], e["instance"]) for e in reversed(read)] == [
        (1, "a"), (2, "a"), (3, "b"), (4, "b"),
    ]  # fmt: skip
    assert [e["n"] for e in (await b.store.read_events(["c1"], 3))[0]] == [4, 3, 2]


async def test_a_former_owners_events_are_refused_and_change_nothing(
    boxes: tuple[Box, Box], admin: EtcdClient
) -> None:
    a, b = boxes
    await a.own()
    a.store.journal("c1", [event("phase", 1)])
    await a.store.close()
    assert a.ha.lease is not None
    await admin.revoke(a.ha.lease)
    await b.own()
    b.store.journal("c1", [event("memory_adopted", 2)])
    await b.store.close()
    before = await keys(admin)
    # a still believes it owns the cluster until its next renewal: its write is refused.
    a.store.journal("c1", [event("remediation", 3)])
    await wait_for(lambda: bool(a.refused), within=5)
    await a.store.close()
    assert "moved on" in a.refused[0]
    assert await keys(admin) == before
    assert [e["n"] for e in (await b.store.read_events(["c1"], 10))[0]] == [2, 1]


async def test_an_instances_own_fenced_event_shows_beside_etcds_journal(
    boxes: tuple[Box, Box],
) -> None:
    a, b = boxes
    await a.own()
    a.store.journal("c1", [event("phase", 1)])
    await a.store.close()
    # As the controller notes it once its claim is gone: no token can write it to etcd, so it
    # is in this instance's state dir only.
    a.store.local.append_events([{**event("fenced", 2), "host": "etcd"}], keep=1000)
    read, _ = await a.store.read_events(["c1"], 10)
    assert [(e["kind"], e["instance"]) for e in read] == [("fenced", "a"), ("phase", "a")]
    assert [e["kind"] for e in (await b.store.read_events(["c1"], 10))[0]] == ["phase"]


async def test_the_journal_keeps_its_newest_events_only(
    etcd: EtcdServer, admin: EtcdClient, tmp_path: Path
) -> None:
    kept = 150
    a = Box(etcd, "a", tmp_path, kept=kept)
    try:
        await a.own()
        # More than one transaction's worth at once, then one at a time past the bound.
        a.store.journal("c1", [event("phase", n) for n in range(2 * EVENTS_PER_WRITE + 10)])
        for n in range(2 * EVENTS_PER_WRITE + 10, 2 * EVENTS_PER_WRITE + 20):
            a.store.journal("c1", [event("phase", n)])
        await a.store.close()
        total = 2 * EVENTS_PER_WRITE + 20
        assert len(await keys(admin)) == kept
        read, _ = await a.store.read_events(["c1"], 1000)
        assert [e["n"] for e in read] == list(range(total - 1, total - kept - 1, -1))
    finally:
        await a.ha.stop()


async def test_events_etcd_did_not_answer_land_once_it_does(
    boxes: tuple[Box, Box], etcd: EtcdServer, admin: EtcdClient
) -> None:
    a, _ = boxes
    await a.own()
    a.store.journal("c1", [event("phase", 0)])
    await a.store.close()
    # A hung etcd: the write times out, then etcd answers again before the owner's deadline
    # (a renewal just before: the deadline is then TTL - margin away).
    await a.ha.round()
    etcd.signal(signal.SIGSTOP)
    try:
        a.store.journal("c1", [event("remediation", 1), event("phase", 2)])
        await asyncio.sleep(0.7)
        a.store.journal("c1", [event("phase", 3)])
    finally:
        etcd.signal(signal.SIGCONT)
    await a.store.close()
    read, _ = await a.store.read_events(["c1"], 10)
    assert [e["n"] for e in read] == [3, 2, 1, 0]
    assert len(await keys(admin)) == 4


async def test_a_secret_in_an_event_never_reaches_etcd(
    boxes: tuple[Box, Box], admin: EtcdClient, tmp_path: Path
) -> None:
    a, _ = boxes
    key = tmp_path / "api_key"
    key.write_text("sk-events-9f3b27c1d4\n")
    assert read_secret(key) == "sk-events-9f3b27c1d4"
    await a.own()
    a.store.journal("c1", [{**event("remediation", 1), "detail": "401 for sk-events-9f3b27c1d4"}])
    await a.store.close()
    found, _ = await admin.get_prefix(events_prefix(PREFIX, "c1"))
    assert len(found) == 1 and b"401 for" in found[0].value
    assert b"sk-events-9f3b27c1d4" not in found[0].value


async def events_of(instance: Instance, cluster: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{instance.port}/events?cluster={cluster}&limit=1000"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200, await r.text()
        found: list[dict[str, Any]] = (await r.json())["events"]
    return found[::-1]


async def test_after_a_sigkill_the_new_owner_shows_the_old_owners_events_then_its_own(
    seed_world: World, pair: tuple[Instance, Instance]
) -> None:
    a, b, cluster = await owner_and_standby(seed_world, pair)

    async def a_acted() -> bool:
        return any(e.get("kind") == "remediation" for e in await events_of(b, cluster))

    # The standby shows what the owner did: the owner's own journal, read from etcd.
    await eventually(a_acted, within=60)
    seen = await events_of(b, cluster)
    assert {e["instance"] for e in seen} == {a.name}
    assert seen == (await events_of(a, cluster))[: len(seen)]
    await a.kill()

    async def b_swept() -> bool:
        return any(
            e["kind"] == "fence_swept" and e["instance"] == b.name
            for e in await events_of(b, cluster)
        )

    await eventually(b_swept, within=2 * TTL + 10)
    after = await events_of(b, cluster)
    # Everything the standby saw of the dead owner is still there, first, unchanged.
    assert after[: len(seen)] == seen
    writers = [e["instance"] for e in after]
    first_b = writers.index(b.name)
    assert set(writers[:first_b]) == {a.name} and set(writers[first_b:]) == {b.name}
    mine = [e["kind"] for e in after[first_b:]]
    assert mine.index("memory_adopted") < mine.index("fence_swept"), mine
    tokens = [e["token"] for e in after]
    assert tokens == sorted(tokens) and tokens[first_b] > tokens[first_b - 1]


async def test_a_planted_journal_key_near_the_sequences_width_never_blocks_the_journal(
    etcd: EtcdServer, admin: EtcdClient, tmp_path: Path
) -> None:
    # Anyone who can write the prefix: one key at the last 20-digit sequence number. Continued
    # from, the next key has 21 digits, sorts inside the trim range, and etcd refuses every
    # transaction that puts it (`duplicate key given in txn request`), memory included.
    planted = events_prefix(PREFIX, "c1") + "9" * 20
    await admin.put(planted, b'{"kind": "planted"}')
    a = Box(etcd, "a", tmp_path)
    try:
        await a.own()
        a.store.journal("c1", [event("phase", 1), event("phase", 2)])
        async with asyncio.timeout(20):
            await a.store.close()
        read, _ = await a.store.read_events(["c1"], 10)
        assert [e["n"] for e in read if "n" in e] == [2, 1]
        assert planted in [key for key, _ in await keys(admin)]
    finally:
        await a.ha.stop()
