"""Ownership on a three-member etcd: losing a member (the leader, the one the owner talks to)
costs no ownership; losing quorum stops everyone, and exactly one owner follows its return."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from sparkd.ha.config import HaSpec
from sparkd.ha.ownership import Ownership
from tests.etcd.conftest import EtcdCluster
from tests.support.ha import leader, wait_for

pytestmark = pytest.mark.etcd

TEST = {"lease_ttl": 3, "renew_interval": 1.0, "request_timeout": 0.5, "margin": 1.0}
# An election takes etcd 1 to 3 s: at TTL 3 it can outlast the owner's deadline by design.
SLOWER = {"lease_ttl": 10, "renew_interval": 2.0, "request_timeout": 1.0, "margin": 2.0}


def spec(urls: list[str], instance: str, timings: dict[str, float]) -> HaSpec:
    return HaSpec.model_validate(
        {"etcd_endpoints": tuple(urls), "instance": instance, "prefix": "t3/", **timings}
    )


@asynccontextmanager
async def watching(a: Ownership, b: Ownership) -> AsyncIterator[list[tuple[bool, bool]]]:
    """Who may act, sampled every 10 ms while the block runs."""
    seen: list[tuple[bool, bool]] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            seen.append((a.may_act("c1"), b.may_act("c1")))
            await asyncio.sleep(0.01)

    task = asyncio.create_task(sample())
    try:
        yield seen
    finally:
        done.set()
        await task


async def test_losing_the_leader_the_owner_talks_to_costs_nothing(etcd3: EtcdCluster) -> None:
    first = await leader(etcd3.members)
    urls = [first.url] + [u for u in etcd3.urls if u != first.url]
    a = Ownership(spec(urls, "a", SLOWER), ["c1"])
    b = Ownership(spec(list(reversed(urls)), "b", SLOWER), ["c1"])
    a.start()
    await wait_for(lambda: a.may_act("c1"), 5)
    b.start()
    try:
        async with watching(a, b) as seen:
            assert a.client.endpoint == first.url
            first.kill()
            await asyncio.sleep(3 * SLOWER["renew_interval"] + 1)
        assert all(mine and not theirs for mine, theirs in seen), "ownership flickered"
        assert a.client.endpoint != first.url  # it moved on
        assert a.renew_failures <= 1
        assert (await leader(etcd3.members)) is not first
    finally:
        await a.stop()
        await b.stop()


async def test_quorum_loss_stops_everyone_then_one_owner(etcd3: EtcdCluster) -> None:
    a = Ownership(spec(etcd3.urls, "a", TEST), ["c1"])
    b = Ownership(spec(etcd3.urls, "b", TEST), ["c1"])
    a.start()
    await wait_for(lambda: a.may_act("c1"), 5)
    b.start()
    try:
        async with watching(a, b) as seen:
            boss = await leader(etcd3.members)
            stopped = [boss, *[m for m in etcd3.members if m is not boss][:1]]
            for member in stopped:
                member.signal(signal.SIGSTOP)  # requests hang: only timeouts tell
            await wait_for(lambda: not a.may_act("c1"), TEST["lease_ttl"])
            await asyncio.sleep(TEST["lease_ttl"])
            assert not b.may_act("c1"), "acquired without a quorum"
            assert a.role("c1") == "no etcd" and b.role("c1") == "no etcd"
            for member in stopped:
                member.signal(signal.SIGCONT)
            await wait_for(lambda: a.may_act("c1") or b.may_act("c1"), 15)
            await asyncio.sleep(2 * TEST["renew_interval"])
        assert not any(mine and theirs for mine, theirs in seen), "two owners at once"
        assert a.may_act("c1") != b.may_act("c1")
    finally:
        await a.stop()
        await b.stop()
