"""With real `sparkd run` processes. First, losing one member: a
three-member etcd loses one member while an owner and a standby run on a healthy simulated
cluster. Both instances talk to that member first, so its loss is one each must ride out by
going to another member. The owner stays the owner throughout: its token never changes, it is
never demoted, it renews through the others (at most one renewal round fails), the standby
never acquires, and the owner repairs what breaks meanwhile. The member is then restarted and
rejoins, and the checker reads what the hosts ran.

A follower's loss is run on the test timings (TTL 3 s); the leader's on longer ones (TTL 10 s),
since the election it starts (a new leader within 2 to 3 s) can outlast a
3 s lease by design; through it, a standby's rounds may fail past its own deadline, and it
says "no etcd" until the next good one (it acts in neither role). The in-process case is
tests/etcd/test_three_members.py. Then losing
the quorum: nobody acts or acquires until it is back, then exactly one owner repairs."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkd.ha.etcd import EtcdClient, EtcdUnavailable
from sparkd_sim.world import World
from tests.etcd.conftest import EtcdCluster, EtcdServer
from tests.support.daemon import eventually
from tests.support.ha import (
    TEST_TIMINGS,
    TTL,
    Instance,
    check_invariants,
    check_one_actor_per_cluster,
    cluster_name,
    healthy_world,
    is_healthy,
    kill_worker,
    leader,
    on_members,
    stamp,
    start_owner_and_standby,
)

pytestmark = pytest.mark.etcd

# An election fits well inside these: renew + 2 x request timeout <= TTL - margin, with room.
ELECTION_TIMINGS = "lease_ttl = 10\nrenew_interval = 2.0\nrequest_timeout = 1.0\nmargin = 2.0\n"
# Renewals the owner must be seen to make through the other members after the loss.
RENEWALS = 3


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with healthy_world(tmp_path, "127.67.0.2") as w:
        yield w


@dataclass
class Sample:
    at: float
    owner: dict[str, object]
    standby: dict[str, object]


@dataclass
class Sampler:
    """The owner's and the standby's /status every 50 ms, while it runs; a read that got
    no answer (a loaded machine) is left out, not taken for a role."""

    owner: Instance
    standby: Instance
    cluster: str
    samples: list[Sample] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            mine, theirs = await asyncio.gather(self.owner.status(), self.standby.status())
            if mine.get("ha") and theirs.get("ha"):
                ours = {**mine["ha"], **mine["ha"]["clusters"][self.cluster]}
                others = {**theirs["ha"], **theirs["ha"]["clusters"][self.cluster]}
                self.samples.append(Sample(time.time(), ours, others))
            await asyncio.sleep(0.05)

    def lapses(self, token: int, election: bool) -> list[tuple[float, object, object, object]]:
        """Samples in which the owner was not the owner with `token`, or the standby not one.
        Through a leader election (`election`), a standby whose rounds failed past its
        deadline says "no etcd" until its next good round, which it is: it acts in neither role,
        so it moves nothing (that it never acquires is checked in the events)."""
        standby = ("standby", "no etcd") if election else ("standby",)
        return [
            (s.at, s.owner["role"], s.owner["token"], s.standby["role"])
            for s in self.samples
            if (s.owner["role"], s.owner["token"]) != ("owner", token)
            or s.standby["role"] not in standby
        ]

    def renewals_since(self, at: float) -> int:
        """Renewals seen after `at`: the lease left going up between two samples."""
        left = [float(s.owner["lease_remaining_seconds"]) for s in self.samples if s.at > at]
        return sum(1 for before, after in itertools.pairwise(left) if after > before)


async def member_status(url: str) -> dict[str, object] | None:
    client = EtcdClient([url], timeout=1)
    try:
        return await client.call("maintenance/status", {})
    except EtcdUnavailable:
        return None
    finally:
        await client.close()


@pytest.mark.parametrize("lost", ["follower", "leader"])
async def test_losing_one_etcd_member_costs_the_owner_nothing(
    world: World, etcd3: EtcdCluster, tmp_path: Path, lost: str
) -> None:
    boss = await leader(etcd3.members)
    gone = boss if lost == "leader" else next(m for m in etcd3.members if m is not boss)
    urls = [gone.url] + [u for u in etcd3.urls if u != gone.url]
    timings = ELECTION_TIMINGS if lost == "leader" else TEST_TIMINGS
    a, b = (
        on_members(Instance(f"ops-{n}", world, gone, tmp_path, timings=timings), urls)
        for n in "ab"
    )  # fmt: skip
    cluster = cluster_name(world)
    sampler = Sampler(a, b, cluster)
    task: asyncio.Task[None] | None = None
    try:
        await start_owner_and_standby(a, b, cluster)
        await eventually(lambda: is_healthy(a), within=90)
        token = (await a.status())["ha"]["clusters"][cluster]["token"]
        assert isinstance(token, int)
        task = asyncio.create_task(sampler.run())
        await eventually(lambda: len(sampler.samples) >= 2, within=30)

        gone.kill()
        killed_at = time.time()
        # Something to do while the member is gone: the Ray worker dies.
        await eventually(lambda: kill_worker(world), within=30)

        def a_repaired() -> bool:
            return any(
                e.get("event") == "action" and e.get("action") == "start_ray_worker"
                and e.get("result") == "ok" and stamp(e) > killed_at
                for e in a.events()
            )  # fmt: skip

        async def rode_it_out() -> bool:
            assert sampler.lapses(token, lost == "leader") == [], "ownership moved or lapsed"
            latest = sampler.samples[-1] if sampler.samples else None
            return (
                a_repaired()
                and await is_healthy(a)
                and sampler.renewals_since(killed_at) >= RENEWALS
                and latest is not None
                and latest.at > killed_at
                and gone.url not in (latest.owner["endpoint"], latest.standby["endpoint"])
            )

        await eventually(rode_it_out, within=120)

        await asyncio.to_thread(etcd3.restart, gone)
        restarted_at = time.time()

        async def rejoined() -> bool:
            said = await member_status(gone.url)
            return said is not None and said.get("leader") not in (None, "0")

        await eventually(rejoined, within=30)
        await eventually(lambda: sampler.renewals_since(restarted_at) >= 1, within=30)
        failures = (await a.metrics())["sparkd_ha_renew_failures_total"]
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await b.stop()  # first: the owner's stop would hand the cluster over to it
        await a.stop()

    assert [s for s in sampler.samples if s.at > restarted_at], "nothing sampled at the end"
    assert sampler.lapses(token, lost == "leader") == [], "ownership moved or lapsed"
    seen = {e.get("event") for e in a.events()} | {e.get("event") for e in b.events()}
    assert not seen & {"demoted", "deadline_passed", "fenced"}, sorted(seen)
    acquired = [e for e in a.events() + b.events() if e.get("event") == "acquired"]
    assert [(e["instance"], e["token"]) for e in acquired] == [(a.name, token)]
    assert failures <= 1, f"{failures:g} renewal rounds failed"
    assert check_one_actor_per_cluster(world, [a, b]) > 0


async def test_quorum_loss_stops_both_instances_then_one_owner_repairs(
    world: World, etcd3: EtcdCluster, tmp_path: Path
) -> None:
    """Scenario 8's last case with real processes: two of three members freeze (the leader
    among them; requests hang, only timeouts tell). The owner stops acting at its deadline,
    neither instance acquires, and both say "no etcd"; what breaks meanwhile is left alone
    (no etcd, no action). Once the members are back, exactly one instance owns the cluster
    and repairs it, and the checker reads what the hosts ran."""
    a, b = (
        on_members(Instance(f"ops-{n}", world, etcd3.members[0], tmp_path), etcd3.urls)
        for n in "ab"
    )  # fmt: skip
    cluster = cluster_name(world)
    stopped: list[EtcdServer] = []
    try:
        await start_owner_and_standby(a, b, cluster)
        await eventually(lambda: is_healthy(a), within=90)
        boss = await leader(etcd3.members)
        stopped = [boss, next(m for m in etcd3.members if m is not boss)]
        for member in stopped:
            member.signal(signal.SIGSTOP)

        async def nobody_owns() -> bool:
            roles = {await a.role(cluster), await b.role(cluster)}
            return roles == {"no etcd"}

        await eventually(nobody_owns, within=2 * TTL + 2)
        lost_at = time.time()
        await eventually(lambda: kill_worker(world), within=30)
        await asyncio.sleep(2 * TTL)
        assert await nobody_owns(), "acted or acquired without a quorum"
        ran = [c for c in world.owned_commands() if c.at > lost_at and not c.refused]
        assert ran == [], ran
        begun = [
            e for i in (a, b) for e in i.events()
            if e.get("event") == "action_start" and stamp(e) > lost_at
        ]  # fmt: skip
        assert begun == [], begun

        for member in stopped:
            member.signal(signal.SIGCONT)
        stopped = []

        async def one_owner() -> bool:
            roles = sorted([await a.role(cluster) or "", await b.role(cluster) or ""])
            return roles == ["owner", "standby"]

        await eventually(one_owner, within=30)
        owner = a if await a.role(cluster) == "owner" else b
        await eventually(lambda: is_healthy(owner), within=90)
        assert (await check_invariants(world, [a, b], etcd3)).ran > 0
    finally:
        for member in stopped:
            member.signal(signal.SIGCONT)
        await b.stop()
        await a.stop()
