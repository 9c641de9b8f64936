"""Sharding against a real etcd, with the
ownership rules in this process and the clock a parameter: the spread, handoffs and their
spacing, orphans, and the instance whose config differs."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest

from sparkd.ha.etcd import EtcdClient
from sparkd.ha.ownership import Ownership
from sparkd.ha.shard import HANDOFF_SPACING
from tests.etcd.conftest import EtcdServer
from tests.support.ha import Clock, spec

pytestmark = pytest.mark.etcd

TTL = 3
CLUSTERS = [f"c{i}" for i in range(1, 7)]


def instance(
    etcd: EtcdServer,
    name: str,
    clock: Clock,
    fingerprint: str = "f1",
    settle: float = TTL,
    busy: set[str] | None = None,
) -> Ownership:
    return Ownership(
        spec(etcd, name),
        CLUSTERS,
        clock=clock,
        fingerprint=fingerprint,
        settle=settle,
        quiet=(lambda cluster: cluster not in busy) if busy is not None else lambda c: True,
    )


async def owners(admin: EtcdClient) -> dict[str, tuple[str, int]]:
    kvs, _ = await admin.get_prefix("test/v1/owner/")
    return {
        kv.key.rsplit("/", 1)[1]: (json.loads(kv.value)["instance"], kv.create_revision)
        for kv in kvs
    }


async def rounds(*instances: Ownership, times: int = 1) -> None:
    for _ in range(times):
        for one in instances:
            await one.round()


def acting(instances: list[Ownership]) -> dict[str, list[str]]:
    return {c: [i.spec.instance for i in instances if i.may_act(c)] for c in CLUSTERS}


async def test_three_spread_two_each_then_a_fourth_takes_its_share(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    clock = Clock()
    three = [instance(etcd, name, clock) for name in ("ops-a", "ops-b", "ops-c")]
    d = instance(etcd, "ops-d", clock)
    everyone = [*three, d]
    try:
        await rounds(*three)  # registered; nobody contends within its first TTL
        assert await owners(admin) == {}
        clock.skip += TTL
        await rounds(*three)
        held = await owners(admin)
        assert sorted(held) == CLUSTERS
        assert sorted(Counter(who for who, _ in held.values()).values()) == [2, 2, 2]
        assert all(len(who) == 1 for who in acting(three).values())
        await rounds(d, *three)  # ops-d joins: nobody hands off to a member this new
        assert await owners(admin) == held
        clock.skip += 2 * TTL
        await rounds(*three)
        gone = {c for c, owner in held.items() if c not in await owners(admin)}
        assert len(gone) == 1  # exactly the one move the balance needs
        (moved,) = gone
        assert not any(i.may_act(moved) for i in everyone)
        await d.round()
        after = await owners(admin)
        assert after[moved][0] == "ops-d" and after[moved][1] > held[moved][1]
        assert {c: v for c, v in after.items() if c != moved} == {
            c: v for c, v in held.items() if c != moved
        }
        assert sorted(Counter(who for who, _ in after.values()).values()) == [1, 1, 2, 2]
        await rounds(*everyone, times=2)  # balanced: it stays so
        assert await owners(admin) == after
        assert all(len(who) == 1 for who in acting(everyone).values())
        assert sorted(i.peers.handoffs for i in three) == [0, 0, 1]
        for one in everyone:
            assert one.status()["assigned"] == {c: who for c, (who, _) in after.items()}
    finally:
        for one in everyone:
            await one.stop()


async def test_one_handoff_a_minute_and_none_mid_action(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    clock = Clock()
    busy = set(CLUSTERS)
    a = instance(etcd, "ops-a", clock, settle=0, busy=busy)
    b = instance(etcd, "ops-b", clock)
    try:
        await a.round()  # alone: it takes all six
        assert Counter(who for who, _ in (await owners(admin)).values()) == {"ops-a": 6}
        await rounds(b, a)
        clock.skip += 2 * TTL
        await rounds(a, b)
        assert a.peers.handoffs == 0  # every cluster in an action or a grace window
        share = sorted(c for c, who in a.peers.assigned.items() if who == "ops-b")
        assert len(share) == 3
        busy.difference_update(share)
        await rounds(a, b)
        assert a.peers.handoffs == 1
        assert Counter(who for who, _ in (await owners(admin)).values()) == {
            "ops-a": 5,
            "ops-b": 1,
        }
        clock.skip += HANDOFF_SPACING - 1
        await rounds(a, b, times=2)
        assert a.peers.handoffs == 1  # not twice within a minute
        clock.skip += 1
        await rounds(a, b)
        assert a.peers.handoffs == 2
        held = await owners(admin)
        assert Counter(who for who, _ in held.values()) == {"ops-a": 4, "ops-b": 2}
        assert all(len(who) == 1 for who in acting([a, b]).values())
    finally:
        await a.stop()
        await b.stop()


async def test_an_orphan_is_taken_by_anyone_after_one_ttl(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    clock = Clock()
    a = instance(etcd, "ops-a", clock, settle=0)
    # A member that is assigned clusters and never takes them (hung, or cannot reach etcd's
    # owner keys): its member key alone, on a lease of its own.
    lease, _ = await admin.grant(60)
    ghost = {"instance": "ops-ghost", "fingerprint": "f1"}
    await admin.put("test/v1/members/ops-ghost", json.dumps(ghost).encode(), lease)
    try:
        await a.round()
        mine = {c for c, who in a.peers.assigned.items() if who == "ops-a"}
        assert len(mine) == 3
        assert set(await owners(admin)) == mine
        clock.skip += TTL - 0.5
        await a.round()
        assert set(await owners(admin)) == mine
        clock.skip += 0.5
        await a.round()
        assert sorted(await owners(admin)) == CLUSTERS
        assert all(a.may_act(c) for c in CLUSTERS)
    finally:
        await a.stop()
        await admin.revoke(lease)


async def test_the_instance_whose_config_differs_refuses_and_says_so(
    etcd: EtcdServer, admin: EtcdClient, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    a = instance(etcd, "ops-a", clock, settle=0)
    b = instance(etcd, "ops-b", clock, settle=0)
    odd = instance(etcd, "ops-odd", clock, fingerprint="f2", settle=0)
    try:
        await rounds(odd)  # first, alone: it takes all six
        assert len(await owners(admin)) == 6
        await rounds(a, b, odd)
        # Two members carry another fingerprint: it gives every cluster back at once.
        assert not any(odd.may_act(c) for c in CLUSTERS)
        assert odd.status()["config_mismatch"] == {"mine": "f2", "theirs": "f1"}
        said = [
            line
            for line in capsys.readouterr().out.splitlines()
            if "config_mismatch" in line and "instance=ops-odd" in line
        ]
        assert len(said) == 1 and "fingerprint=f2" in said[0] and "others=f1" in said[0]
        clock.skip += 2 * TTL
        await rounds(odd, a, b, odd)
        held = await owners(admin)
        assert sorted(held) == CLUSTERS
        assert {who for who, _ in held.values()} == {"ops-a", "ops-b"}
        assert not any(odd.may_act(c) for c in CLUSTERS)  # not even an orphan
        assert a.status()["config_mismatch"] is None
        assert "ops-odd" not in a.peers.assigned.values()
        member, _ = await admin.get("test/v1/members/ops-odd")
        assert member is not None and json.loads(member.value)["fingerprint"] == "f2"
        # Its config is made to match (a reload): it shares the clusters again.
        odd.set_fingerprint("f1")
        await rounds(odd, a, b)
        assert odd.status()["config_mismatch"] is None
        assert "ops-odd" in a.peers.assigned.values()
    finally:
        for one in (a, b, odd):
            await one.stop()


async def test_a_fresh_instance_takes_over_at_once_what_it_saw_owned(etcd: EtcdServer) -> None:
    clock = Clock()
    a = instance(etcd, "ops-a", clock, settle=0)
    b = instance(etcd, "ops-b", clock)  # it waits one TTL only for clusters it never saw owned
    try:
        await a.round()
        await b.round()
        assert all(a.may_act(c) for c in CLUSTERS)
        await a.stop()  # a graceful stop, within b's first TTL: b takes every cluster at once
        await b.round()
        assert all(b.may_act(c) for c in CLUSTERS)
        assert b.takeovers == len(CLUSTERS)
    finally:
        await b.stop()


async def test_a_deletion_heard_during_a_round_brings_the_next_at_once(etcd: EtcdServer) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"])
    await a.round()
    b = Ownership(spec(etcd, "b"), ["c1"])
    # The standby never renews on its own: only the deletion it heard can make it try again.
    b.spec = b.spec.model_copy(update={"renew_interval": 3600.0})
    plain = b.round
    inside, leave = asyncio.Event(), asyncio.Event()

    async def held_open() -> None:
        await plain()
        if not inside.is_set():  # the first round stays open while the owner goes
            inside.set()
            await leave.wait()

    b.round = held_open  # type: ignore[method-assign]
    b.start()
    try:
        await asyncio.wait_for(inside.wait(), 5)
        await a.stop()  # its key deleted: b's watch hears it while its round is still open
        await asyncio.sleep(0.5)
        leave.set()
        took = time.monotonic()
        while not b.may_act("c1"):
            assert time.monotonic() - took < 2.0, "the deletion heard mid-round was lost"
            await asyncio.sleep(0.02)
    finally:
        await b.stop()
