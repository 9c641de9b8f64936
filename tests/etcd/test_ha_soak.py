"""HA.md section 6, scenario 17: a bounded randomized soak. Two `sparkd run` processes on one
simulated cluster and a real etcd (TTL 3 s); seeded random steps kill the owner, freeze it past
its lease, stop it gracefully, or break the cluster so the owner must act, and after each the
same checker as the other HA tests (tests/support/ha.py) reads the hosts' command log, the
instances' logs and etcd's record of the memory: one owner per token, tokens never
backwards, never two actors, no refused command changed anything, no budgeted attempt, pause
or latch lost or counted twice. Marked `soak`: SPARKD_SOAK_COUNT sets the number of seeded
runs (CI runs a small count)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer
from tests.support.daemon import eventually
from tests.support.ha import (
    TTL,
    Instance,
    check_invariants,
    cluster_name,
    healthy_world,
    kill_worker,
    swept_since,
    wait_healthy,
)

pytestmark = [pytest.mark.etcd, pytest.mark.soak]

COUNT = int(os.environ.get("SPARKD_SOAK_COUNT", "2"))
STEPS = 4
KINDS = ("kill", "freeze", "term", "break")


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with healthy_world(tmp_path, "127.63.0.2") as w:
        yield w


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


async def restart(instance: Instance) -> None:
    instance.killed_at = None
    await instance.start()


@pytest.mark.parametrize("seed", range(COUNT))
async def test_random_kills_freezes_and_stops_never_make_two_actors(
    world: World, etcd: EtcdServer, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    cluster = cluster_name(world)
    pair = [Instance(f"ops-{n}", world, etcd, tmp_path) for n in "ab"]
    try:
        for instance in pair:
            await instance.start()
        steps = [rng.choice(KINDS) for _ in range(STEPS)]
        for kind in steps:
            owner = await one_owner(pair, cluster)
            await wait_healthy(owner, within=120)
            other = next(i for i in pair if i is not owner)
            began = time.time()
            if kind == "kill":
                await owner.kill()
                await eventually(lambda o=other: _owns(o, cluster), within=6 * TTL)
                await restart(owner)
            elif kind == "freeze":
                owner.signal(signal.SIGSTOP)
                await eventually(lambda o=other: _owns(o, cluster), within=6 * TTL)
                owner.signal(signal.SIGCONT)
            elif kind == "term":
                owner.signal(signal.SIGTERM)
                assert owner.proc is not None
                assert await asyncio.wait_for(owner.proc.wait(), 30) == 0
                await eventually(lambda o=other: _owns(o, cluster), within=6 * TTL)
                await restart(owner)
            else:
                # The owner must act: the Ray worker dies under it. Its /status says healthy
                # until a look sees the node gone, so wait for the repair itself first.
                before = owned(world)
                await eventually(lambda: kill_worker(world), within=30)
                await eventually(lambda b=before: owned(world) > b, within=6 * TTL + 30)
            new = await one_owner(pair, cluster)
            if kind != "break":
                # The new owner may read healthy from its looks as a standby, before its first
                # look as owner swept the hosts: the checker needs what it ran.
                await eventually(
                    lambda n=new, b=began: swept_since(world, n.name, b), within=6 * TTL
                )
            await wait_healthy(new, within=120)
            checked = await check_invariants(world, pair, etcd)
            assert checked.ran > 0, (steps, checked)
    finally:
        for instance in pair:
            await instance.stop()


def owned(world: World) -> int:
    """How many commands under an owner's token the hosts ran (refused ones do not count)."""
    return sum(1 for c in world.owned_commands() if not c.refused)


async def _owns(instance: Instance, cluster: str) -> bool:
    return await role(instance, cluster) == "owner"
