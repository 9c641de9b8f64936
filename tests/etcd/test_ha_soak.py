"""A bounded randomized soak. Two `sparkd run` processes on one
simulated cluster and a real three-member etcd (TTL 3 s), each instance reaching every member
through a proxy of its own. In a seeded random order, each run's steps kill the owner, freeze
it past its lease, stop it gracefully, cut it off from etcd (a partition: its proxies swallow
every byte), kill an etcd member (the leader or a follower) and start it again, or break the
cluster so the owner must act; two of the four takeovers land around a repair, a random
moment after the Ray worker died. After each step the same checker as the other HA tests
(tests/support/ha.py) reads the hosts' command log, the instances' logs and etcd's record of
the memory: one owner per token, tokens never backwards, never two actors, no refused command
changed anything, no budgeted attempt, pause or latch lost or counted twice. Marked `soak`:
SPARKD_SOAK_COUNT sets the number of seeded runs (CI runs a small count)."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd_sim.world import World
from tests.etcd.conftest import Blackhole, EtcdCluster
from tests.support.daemon import eventually
from tests.support.ha import (
    TTL,
    Instance,
    check_invariants,
    cluster_name,
    healthy_world,
    kill_worker,
    on_members,
    swept_since,
    wait_healthy,
)

pytestmark = [pytest.mark.etcd, pytest.mark.soak]

COUNT = int(os.environ.get("SPARKD_SOAK_COUNT", "2"))
TAKEOVERS = ("kill", "freeze", "term", "partition")
KINDS = (*TAKEOVERS, "member", "break")
# Takeovers per run that land around a repair.
MIDWAY = 2
# Repairs a run may need: the break, and each midway repair twice (the one the fault
# interrupted, whose outcome is unknown and so stays charged, and the new owner's). The
# world's own budget of 3 is for one incident, not for a soak's run of them.
BUDGET = 1 + 2 * MIDWAY + 1


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with healthy_world(tmp_path, "127.63.0.2") as w:
        yield w


class Reached:
    """An instance and its proxies, one to each etcd member: a partition cuts them all."""

    def __init__(self, instance: Instance, holes: list[Blackhole]) -> None:
        self.instance = instance
        self.holes = holes

    def cut(self) -> None:
        for hole in self.holes:
            hole.cut()

    def heal(self) -> None:
        for hole in self.holes:
            hole.heal()


async def behind_proxies(name: str, world: World, etcd3: EtcdCluster, tmp_path: Path) -> Reached:
    holes = [Blackhole(m.address, m.client_port) for m in etcd3.members]
    for hole in holes:
        await hole.start()
    instance = on_members(Instance(name, world, etcd3.members[0], tmp_path), [h.url for h in holes])
    instance.config.write_text(
        re.sub(r"^(\s*)budget = .*$", rf"\1budget = {BUDGET}", instance.config.read_text(),
               flags=re.M)
    )  # fmt: skip
    return Reached(instance, holes)


async def role(instance: Instance, cluster: str) -> str | None:
    return await instance.role(cluster)


async def one_owner(pair: list[Instance], cluster: str) -> Instance:
    """The instance that owns the cluster once exactly one does and the other stands by."""
    found: list[Instance] = []

    async def settled() -> bool:
        roles = [await role(i, cluster) for i in pair]
        found[:] = [i for i, r in zip(pair, roles, strict=True) if r == "owner"]
        return sorted(r or "" for r in roles) == ["owner", "standby"]

    await eventually(settled, within=6 * TTL + 30, poll=0.1)
    return found[0]


@pytest.mark.parametrize("seed", range(COUNT))
async def test_random_faults_never_make_two_actors(
    world: World, etcd3: EtcdCluster, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = cluster_name(world)
    reached = [await behind_proxies(f"ops-{n}", world, etcd3, tmp_path) for n in "ab"]
    pair = [r.instance for r in reached]
    steps = rng.sample(KINDS, len(KINDS))
    midway = set(rng.sample(TAKEOVERS, MIDWAY))
    try:
        for instance in pair:
            await instance.start()
        for kind in steps:
            owner = await one_owner(pair, cluster)
            await wait_healthy(owner, within=120)
            other = next(i for i in pair if i is not owner)
            began = time.time()
            if kind in midway:
                await eventually(lambda: kill_worker(world), within=30)
                await asyncio.sleep(rng.uniform(0.0, 1.5))
            if kind == "kill":
                await owner.kill()
                await eventually(lambda o=other: _owns(o, cluster), within=6 * TTL)
                await owner.start()
            elif kind == "freeze":
                owner.signal(signal.SIGSTOP)
                await eventually(lambda o=other: _owns(o, cluster), within=6 * TTL)
                owner.signal(signal.SIGCONT)
            elif kind == "term":
                owner.signal(signal.SIGTERM)
                assert owner.proc is not None
                assert await asyncio.wait_for(owner.proc.wait(), 30) == 0
                await eventually(lambda o=other: _owns(o, cluster), within=6 * TTL)
                await owner.start()
            elif kind == "partition":
                cut = reached[pair.index(owner)]
                cut.cut()
                await eventually(lambda o=other: _owns(o, cluster), within=6 * TTL)
                await eventually(lambda o=owner: _lost(o, cluster), within=6 * TTL)
                cut.heal()
            elif kind == "member":
                # The leader or a follower: a leader's election may outlast a 3 s lease, and
                # then the owner demotes, which is safe; the checker is what must hold.
                member = rng.choice(etcd3.members)
                member.kill()
                await asyncio.sleep(rng.uniform(TTL, 3 * TTL))
                await asyncio.to_thread(etcd3.restart, member)
            else:
                # The owner must act: the Ray worker dies under it. Its /status says healthy
                # until a look sees the node gone, so wait for the repair itself first.
                before = owned(world)
                await eventually(lambda: kill_worker(world), within=30)
                await eventually(lambda b=before: owned(world) > b, within=6 * TTL + 30)
            new = await one_owner(pair, cluster)
            if new is not owner:
                # The new owner may read healthy from its looks as a standby, before its first
                # look as owner swept the hosts: the checker needs what it ran.
                await eventually(
                    lambda n=new, b=began: swept_since(world, n.name, b), within=6 * TTL
                )
            await wait_healthy(new, within=120)
            checked = await check_invariants(world, pair, etcd3)
            assert checked.ran > 0, (steps, midway, checked)
    finally:
        for instance in pair:
            await instance.stop()
        for r in reached:
            for hole in r.holes:
                await hole.close()


def owned(world: World) -> int:
    """How many commands under an owner's token the hosts ran (refused ones do not count)."""
    return sum(1 for c in world.owned_commands() if not c.refused)


async def _owns(instance: Instance, cluster: str) -> bool:
    return await role(instance, cluster) == "owner"


async def _lost(instance: Instance, cluster: str) -> bool:
    return await role(instance, cluster) not in ("owner", None)
