"""SIGKILL of the owner mid-recovery, two real `sparkd run` processes on one simulated cluster:
the standby continues from the memory in etcd. The attempt the dead owner spent is still spent
(once), its launch is not replayed, the load it started keeps its grace, and a latch it set
holds: read from the new owner's API and metrics, from what the simulated hosts ran and by
the HA checker."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd.settings import load_settings
from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer
from tests.support.daemon import eventually, mutations
from tests.support.ha import (
    PRODUCTION_TIMINGS,
    TTL,
    Instance,
    budget_left,
    budgets,
    check_invariants,
    check_never_two_actors,
    cli,
    cluster_name,
    get,
    intent_at,
    memory_history,
    operator_token,
    owner_and_standby,
    paused_by,
    start_on_a_slow_load,
    two_more_looks,
    wait_healthy,
)

pytestmark = pytest.mark.etcd


@pytest.fixture
async def slow_renewals(
    seed_world: World, etcd: EtcdServer, tmp_path: Path
) -> AsyncIterator[tuple[Instance, Instance]]:
    """Two operated instances on the production timings: a renewal every 5 s, so a record a
    new owner reads only at its next renewal would come long after its first look."""
    token = operator_token(tmp_path)
    a, b = (
        Instance(name, seed_world, etcd, tmp_path, timings=PRODUCTION_TIMINGS, token_file=token)
        for name in ("ops-a", "ops-b")
    )
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


def launches(world: World) -> list[float]:
    return [r.at for r in mutations(world) if r.command.startswith("vllm serve")]


async def test_the_standby_keeps_the_spent_attempt_and_the_loads_grace(
    seed_world: World, pair: tuple[Instance, Instance], etcd: EtcdServer
) -> None:
    a, b = pair
    budget = load_settings(seed_world.config_path).clusters[0].policy.budget
    cluster = await start_on_a_slow_load(seed_world, a, b)
    # The standby never acted: what it remembers of its own spends nothing.
    assert await budget_left(b, cluster, "start_model") == budget

    async def launched() -> bool:
        return bool(launches(seed_world))

    await eventually(launched, within=60)
    await a.kill()
    assert a.killed_at is not None
    finished = [
        e for e in a.events() if e.get("event") == "action" and e.get("action") == "start_model"
    ]

    async def b_swept() -> bool:
        return any(c.owner.instance == b.name for c in seed_world.owned_commands())

    await eventually(b_swept, within=2 * TTL + 5)

    await two_more_looks(b, within=10)
    # The dead owner's launch is spent once on the new owner too.
    assert await budget_left(b, cluster, "start_model") == budget - len(launches(seed_world))
    events = json.loads(await get(b, f"/events?cluster={cluster}"))["events"]
    (token,) = {
        e["token"] for e in events if e["kind"] == "memory_adopted" and e["instance"] == b.name
    }
    # The intent as the new owner found it: its token is its owner key's create revision, and
    # after that no write of the dead owner's can land. The outcome clears the intent in the
    # write behind the action's log line, so a kill between the two leaves it.
    left = await intent_at(etcd, cluster, token)
    unknown = [e["intent"] for e in events if e["kind"] == "intent_unknown"]
    if left is None:
        assert finished, "the intent went without the action's outcome"
        assert unknown == []
    else:
        # Killed inside the action, or before its outcome was written: the new owner says so.
        assert unknown == [left] and left["action"] == "start_model", (unknown, left)

    await wait_healthy(b, within=90)
    # The slow load finished under the new owner: it was never relaunched, nor killed.
    assert len(launches(seed_world)) == 1
    by_b = [c for c in seed_world.owned_commands() if c.owner.instance == b.name]
    assert by_b, "the new owner swept no host"
    for host in {c.host for c in by_b}:
        mine = [c for c in by_b if c.host == host]
        assert mine[0].command.endswith("true\n} 9>&-"), mine[0].command[-80:]
        assert mine[0].at > a.killed_at
    check_never_two_actors(seed_world, a, b)
    checked = await check_invariants(seed_world, [a, b], etcd)
    assert checked.ran > 0 and checked.attempts >= len(launches(seed_world)), checked
    assert time.time() > a.killed_at


async def memory_latched(etcd: EtcdServer, cluster: str) -> bool:
    """Whether etcd's newest record of the cluster's memory holds a latch."""
    history = await memory_history(etcd, cluster)
    return bool(history) and bool(history[-1]["memory"].get("blocked"))


async def blocked_by(instance: Instance) -> str | None:
    clusters = (await instance.status()).get("clusters") or []
    latch = clusters[0].get("blocked") if clusters else None
    return str(latch.get("reason")) if latch else None


async def test_a_latch_the_budget_set_holds_across_a_takeover(
    seed_world: World, pair: tuple[Instance, Instance], etcd: EtcdServer
) -> None:
    """The model fails every probe and the budget (one restart) is spent: the owner latches
    the cluster `blocked` and is killed. The new owner continues latched, and acts on nothing:
    read from its /status, what the hosts ran and the checker (etcd's record of the memory,
    write by write)."""
    for instance in pair:
        text = re.sub(
            r"^(\s*)budget = .*$", r"\1budget = 1", instance.config.read_text(), flags=re.M
        )
        instance.config.write_text(text)
    a, b, cluster = await owner_and_standby(seed_world, pair)
    await wait_healthy(a, within=90)
    await seed_world.fault("answer-style", "spark-a", "http_500")

    async def a_latched() -> bool:
        return await blocked_by(a) is not None

    await eventually(a_latched, within=60)
    latch = await blocked_by(a)
    # In etcd before the owner dies: what the next owner adopts.
    await eventually(lambda: memory_latched(etcd, cluster), within=30)
    await a.kill()
    assert a.killed_at is not None

    async def b_owns_latched() -> bool:
        return await b.role(cluster) == "owner" and await blocked_by(b) == latch

    await eventually(b_owns_latched, within=6 * TTL)

    await two_more_looks(b, within=15)
    # Latched: the new owner swept the hosts and changed nothing else.
    assert mutations(seed_world, since=a.killed_at) == []
    check_never_two_actors(seed_world, a, b)
    checked = await check_invariants(seed_world, [a, b], etcd)
    assert checked.ran > 0 and checked.attempts >= 1, checked


async def test_a_pause_no_owner_took_holds_from_the_new_owners_first_step(
    seed_world: World, slow_renewals: tuple[Instance, Instance]
) -> None:
    a, b, cluster = await owner_and_standby(seed_world, slow_renewals)

    await wait_healthy(a, within=90)
    # The owner dies; while nobody owns the cluster an operator pauses it (through the
    # standby), and the model crashes: the record is in etcd, in no memory yet.
    await a.kill()
    code, out = await cli(b, "pause", cluster, "--reason", "swapping a cable")
    assert code == 0, out
    since = time.time()
    await seed_world.fault("crash-model", "spark-a")

    async def b_owns_paused() -> bool:
        return await b.role(cluster) == "owner" and await paused_by(b) == "swapping a cable"

    await eventually(b_owns_paused, within=40)
    await asyncio.sleep(2)
    # The new owner continued from etcd's memory (no pause in it) and still never acted.
    assert mutations(seed_world, since=since) == [], "a paused cluster was acted on"


async def test_one_instance_restarted_without_its_state_dir_keeps_its_memory(
    seed_world: World, slow_renewals: tuple[Instance, Instance], tmp_path: Path
) -> None:
    """With [ha] the memory lives in etcd. Restarted with its local state
    dir gone, one instance still knows the attempts it spent and the pause it was given."""
    a, _ = slow_renewals
    cluster = cluster_name(seed_world)
    await a.start()

    await wait_healthy(a, within=120)
    spent = await budgets(a, cluster)
    budget = load_settings(seed_world.config_path).clusters[0].policy.budget
    # Bringing the seed-morning cluster up spent attempts (the model's launch at least).
    assert spent and min(spent.values()) < budget, spent
    rc, out = await cli(a, "pause", cluster, "--reason", "kernel update")
    assert rc == 0, out

    async def paused() -> bool:
        return await paused_by(a) == "kernel update"

    await eventually(paused, within=15)
    await a.stop()
    shutil.rmtree(tmp_path / "state-ops-a")
    since = time.time()
    await a.start()

    async def adopted() -> bool:
        if await a.role(cluster) != "owner":
            return False
        # The journal is etcd's: the first start's adoption is in it too.
        events = json.loads(await get(a, f"/events?cluster={cluster}"))["events"]
        return any(e["kind"] == "memory_adopted" and e["at"] >= since for e in events)

    await eventually(adopted, within=60)
    assert await paused_by(a) == "kernel update"
    assert await budgets(a, cluster) == spent
    # Paused: the restarted owner changed nothing on the hosts.
    assert mutations(seed_world, since=since) == []
    events = await get(a, f"/events?cluster={cluster}")
    assert "memory_adopted" in events
