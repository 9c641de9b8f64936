"""HA.md section 6, scenarios 11 and 12, with real `sparkd run` processes, six simulated
one-host clusters and a real etcd (TTL 3 s): three instances spread the clusters two each, a
fourth joins and takes its share by handoff, a killed one's clusters are owned again within
the TTL, and an instance whose config differs refuses them all.

After each step the same checker reads what the hosts ran: per cluster, every owned command
names one owner (token and instance), the tokens never go backwards, and the spans in which
different tokens' commands ran, and the spans of different instances' actions in their logs,
never overlap.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from sparkd.commands import sparkd_spec_labels
from sparkd.ha.etcd import EtcdClient
from sparkd.sim.timing import Timing
from sparkd.sim.world import World
from tests.e2e.conftest import eventually
from tests.etcd.conftest import EtcdServer
from tests.etcd.test_two_daemons import TTL, Instance

pytestmark = pytest.mark.etcd

CLUSTERS = 6


@pytest.fixture
async def six(tmp_path: Path) -> AsyncIterator[World]:
    async with World(
        tmp_path / "world",
        hosts=CLUSTERS,
        clusters=CLUSTERS,
        scenario="healthy",
        timing=Timing.fast(),
        spec_labels=sparkd_spec_labels,
        first_address="127.61.0.2",
    ) as world:
        yield world


@pytest.fixture
async def admin(etcd: EtcdServer) -> AsyncIterator[EtcdClient]:
    client = EtcdClient([etcd.url], timeout=2)
    yield client
    await client.close()


async def owners(admin: EtcdClient) -> dict[str, str]:
    kvs, _ = await admin.get_prefix("sparkd/v1/owner/")
    return {kv.key.rsplit("/", 1)[1]: json.loads(kv.value)["instance"] for kv in kvs}


def spread(held: dict[str, str]) -> list[int]:
    return sorted(Counter(held.values()).values())


def action_spans(instance: Instance, until: float) -> dict[str, list[tuple[float, float]]]:
    """Per cluster, [start, end] of each action in the instance's log."""
    spans: dict[str, list[tuple[float, float]]] = {}
    open_at: dict[str, float] = {}
    for event in instance.events():
        cluster = event.get("cluster")
        if not isinstance(cluster, str):
            continue
        at = datetime.fromisoformat(event["timestamp"]).timestamp()
        if event.get("event") == "action_start":
            open_at[cluster] = at
        elif event.get("event") == "action" and cluster in open_at:
            spans.setdefault(cluster, []).append((open_at.pop(cluster), at))
    for cluster, at in open_at.items():
        spans.setdefault(cluster, []).append((at, instance.killed_at or until))
    return spans


def check_one_actor_per_cluster(world: World, instances: list[Instance]) -> int:
    """The checker; returns how many owned commands the hosts ran, so a test sees it looked."""
    by_token: dict[tuple[str, int], list[float]] = {}
    instance_of: dict[tuple[str, int], str] = {}
    newest: dict[str, int] = {}
    ran = 0
    for command in sorted(world.owned_commands(), key=lambda c: c.at):
        if command.refused:
            continue
        ran += 1
        owner = command.owner
        key = (owner.cluster, owner.token)
        assert instance_of.setdefault(key, owner.instance) == owner.instance, key
        assert owner.token >= newest.get(owner.cluster, 0), (
            f"{owner.instance} token {owner.token} ran on {command.host} at {command.at:.3f} "
            f"after token {newest[owner.cluster]}"
        )
        newest[owner.cluster] = owner.token
        by_token.setdefault(key, []).append(command.at)
    spans = sorted((c, min(ats), max(ats), t) for (c, t), ats in by_token.items())
    for (c1, _, end, t1), (c2, start, _, t2) in itertools.pairwise(spans):
        if c1 == c2:
            assert end <= start, f"{c1}: token {t1} ran until {end}, token {t2} from {start}"
    now = time.time() + 1
    logged = [(i.name, action_spans(i, now)) for i in instances]
    for index, (name1, spans1) in enumerate(logged):
        for name2, spans2 in logged[index + 1 :]:
            for cluster, found in spans1.items():
                for s1, e1 in found:
                    for s2, e2 in spans2.get(cluster, []):
                        assert e1 < s2 or e2 < s1, f"{cluster}: {name1} and {name2} both acted"
    return ran


async def crash_every_model(world: World) -> None:
    for host in world.hosts:
        try:
            await world.fault("crash-model", host)
        except ValueError:  # already down: its owner is at it
            continue


async def test_three_then_four_instances_share_six_clusters(
    six: World, etcd: EtcdServer, admin: EtcdClient, tmp_path: Path
) -> None:
    a, b, c, d = (Instance(f"ops-{n}", six, etcd, tmp_path) for n in "abcd")
    everyone = [a, b, c, d]
    try:
        await asyncio.gather(a.start(), b.start(), c.start())

        async def two_each() -> bool:
            held = await owners(admin)
            return len(held) == CLUSTERS and spread(held) == [2, 2, 2]

        await eventually(two_each, within=60)
        first = await owners(admin)
        assert set(first.values()) == {a.name, b.name, c.name}
        # Each owner repairs its own clusters; nobody hands anything off meanwhile.
        await crash_every_model(six)
        await asyncio.sleep(2)
        assert await owners(admin) == first

        # A fourth joins while every cluster is being repaired: its share comes by handoff,
        # once the cluster settled, and only what the balance needs moves (one cluster).
        await d.start()

        async def d_member() -> bool:
            kv, _ = await admin.get(f"sparkd/v1/members/{d.name}")
            return kv is not None

        await eventually(d_member, within=30)
        await crash_every_model(six)

        async def d_took_its_share() -> bool:
            held = await owners(admin)
            return len(held) == CLUSTERS and spread(held) == [1, 1, 2, 2]

        await eventually(d_took_its_share, within=90)
        second = await owners(admin)
        moved = {name for name in first if second[name] != first[name]}
        assert len(moved) == 1 and {second[name] for name in moved} == {d.name}
        statuses = [(await i.status()).get("ha") or {} for i in everyone]
        for status in statuses:
            assert status["assigned"] == second
        roles = Counter(
            claim["role"] for s in statuses for claim in s["clusters"].values()
        )  # fmt: skip
        assert roles["owner"] == CLUSTERS
        handed = [e for i in everyone for e in i.events() if e.get("event") == "handed_off"]
        assert [(e["cluster"], e["to"]) for e in handed] == [(moved.pop(), d.name)]
        assert check_one_actor_per_cluster(six, everyone) > 0

        # An owner killed: its clusters are owned again within the TTL (+ 1 s of slack).
        victim = b
        theirs = {name for name, who in second.items() if who == victim.name}
        await victim.kill()
        assert victim.killed_at is not None
        while True:
            held = await owners(admin)
            if all(held.get(name) not in (None, victim.name) for name in theirs):
                break
            assert time.time() - victim.killed_at <= TTL + 1, f"not owned again: {held}"
            await asyncio.sleep(0.05)
        await crash_every_model(six)

        async def repaired_by_the_rest() -> bool:
            held = await owners(admin)
            return len(held) == CLUSTERS and spread(held) == [2, 2, 2]

        await eventually(repaired_by_the_rest, within=30)
        assert check_one_actor_per_cluster(six, everyone) > 0
    finally:
        for one in everyone:
            await one.stop()


async def test_an_instance_with_another_config_refuses_every_cluster(
    six: World, etcd: EtcdServer, admin: EtcdClient, tmp_path: Path
) -> None:
    a, b = Instance("ops-a", six, etcd, tmp_path), Instance("ops-b", six, etcd, tmp_path)
    odd = Instance("ops-odd", six, etcd, tmp_path)
    # One cluster's probe prompt differs: the same clusters, not the same specs.
    text = odd.config.read_text()
    text = re.sub(r"^(\s*)prompt = .*$", r'\1prompt = "Hi."', text, count=1, flags=re.M)
    odd.config.write_text(text)
    try:
        await asyncio.gather(a.start(), b.start())

        async def shared() -> bool:
            held = await owners(admin)
            return len(held) == CLUSTERS and spread(held) == [3, 3]

        await eventually(shared, within=60)
        await odd.start()

        async def refused() -> bool:
            status = (await odd.status()).get("ha") or {}
            return bool(status.get("config_mismatch"))

        await eventually(refused, within=30)
        mine = ((await odd.status())["ha"])["config_mismatch"]
        theirs = ((await a.status())["ha"])["fingerprint"]
        assert mine["theirs"] == theirs and mine["mine"] != theirs
        assert (await odd.metrics())["sparkd_ha_config_mismatch"] == 1
        said = [e for e in odd.events() if e.get("event") == "config_mismatch"]
        assert said and (said[0]["fingerprint"], said[0]["others"]) == (mine["mine"], theirs)
        # Past the orphan delay and a crash on every host: still nothing of it runs anywhere.
        await crash_every_model(six)
        await asyncio.sleep(2 * TTL)
        assert odd.name not in (await owners(admin)).values()
        assert all(c.owner.instance != odd.name for c in six.owned_commands())
        assert odd.name not in ((await a.status())["ha"])["assigned"].values()
        assert check_one_actor_per_cluster(six, [a, b, odd]) > 0
    finally:
        for one in (a, b, odd):
            await one.stop()
