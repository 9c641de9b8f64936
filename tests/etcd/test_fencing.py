"""With real `sparkd run` processes and a real etcd (TTL 3 s): the
owner sends an action, its bytes reach the host late (`late-delivery`, as a partition holding
them would) and the owner is SIGSTOPped past its TTL meanwhile. The standby takes over and
sweeps the hosts; when the stale command lands, the host's fence refuses it (exit 76) and
nothing of it runs: the HA checker finds no tool call of its session and the host's fence
record still the new owner's. Woken, the old owner takes the refusal for what it is: an event
`fenced`, `sparkd_ha_fenced_total` up by one, the action skipped with no budget spent, and it
demotes. With `host_fencing = false`, the same command runs, and the checker (tokens never go
backwards in what the hosts ran) catches it: the test bites."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sparkd.ha.etcd import EtcdClient
from sparkd.ha.memory import memory_key
from sparkd.model import exits
from sparkd.shell import catalogue
from sparkd_sim.owned import OwnedCommand
from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer
from tests.support.daemon import eventually, mutations
from tests.support.ha import (
    TTL,
    Instance,
    budgets,
    check_invariants,
    cluster_name,
    get,
    kill_worker,
    owner_and_standby,
    stamp,
    two_more_looks,
    wait_healthy,
)
from tests.support.process import SPARKD

pytestmark = pytest.mark.etcd
# Longer than a takeover (TTL + 1 s), the new owner's sweep and its first action together.
LATE = 14.0


def backwards(world: World) -> list[str]:
    """What the hosts ran (not refused) whose token was older than one already run for the
    same cluster: a former owner acting after a newer one."""
    problems = []
    newest: dict[str, OwnedCommand] = {}
    for command in world.owned_commands():
        if command.refused:
            continue
        top = newest.get(command.owner.cluster)
        if top is not None and command.owner.token < top.owner.token:
            problems.append(
                f"{command.owner.instance} token {command.owner.token} ran on {command.host} "
                f"at {command.at:.3f}, after {top.owner.instance} token {top.owner.token}"
            )
        elif top is None or command.owner.token > top.owner.token:
            newest[command.owner.cluster] = command
    return problems


async def attempts_in_etcd(admin: EtcdClient, cluster: str) -> list[dict[str, Any]]:
    """The budget attempts in the cluster's memory record in etcd, as stored."""
    kv, _ = await admin.get(memory_key("sparkd/v1/", cluster))
    assert kv is not None
    found: list[dict[str, Any]] = json.loads(kv.value)["memory"]["attempts"]
    return found


def what_was_tried(attempts: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    """The attempts without the ages they were stored with."""
    return [(a["key"], a["ok"], a.get("reason", "")) for a in attempts]


@pytest.fixture
async def unfenced_pair(
    seed_world: World, etcd: EtcdServer, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Instance, Instance]]:
    fencing: bool = request.param
    pair = (
        Instance("ops-a", seed_world, etcd, tmp_path),
        Instance("ops-b", seed_world, etcd, tmp_path),
    )
    for instance in pair:
        if not fencing:  # [ha] is the config's last section
            instance.config.write_text(instance.config.read_text() + "host_fencing = false\n")
    try:
        yield pair
    finally:
        for instance in pair:
            await instance.stop()


@pytest.mark.parametrize("unfenced_pair", [True, False], ids=["fenced", "unfenced"], indirect=True)
async def test_a_paused_owners_late_command_is_refused_by_the_host(
    seed_world: World,
    unfenced_pair: tuple[Instance, Instance],
    admin: EtcdClient,
    etcd: EtcdServer,
    request: pytest.FixtureRequest,
) -> None:
    fencing = request.node.callspec.id == "fenced"
    a, b, cluster = await owner_and_standby(seed_world, unfenced_pair)

    await wait_healthy(a, within=120)
    assert (await a.metrics())["sparkd_ha_fenced_total"] == 0
    worker = seed_world.host("spark-b").ssh
    await seed_world.fault("late-delivery", "spark-b", str(LATE))
    await eventually(lambda: kill_worker(seed_world), within=30)
    # The owner's restart of the worker is on its way to the host: the owner checked its lease
    # and sent it. Frozen now, it cannot notice its lease running out.
    await eventually(lambda: worker.delayed == 1, within=30, poll=0.005)
    # The owner's own accounting with the restart charged (before it was sent) and whatever
    # it did since the kill: one torn look (the worker's containers read before the kill, the
    # model's death after it) may have relaunched the model first, a budgeted attempt of its
    # own. Read now, the stale command is still held for LATE seconds.
    charged = await budgets(a, cluster)
    stopped_at = a.signal(signal.SIGSTOP)

    async def b_owns() -> bool:
        return await b.role(cluster) == "owner"

    await eventually(b_owns, within=TTL + 2)

    def landed() -> list[OwnedCommand]:
        return [
            c
            for c in seed_world.owned_commands()
            if c.owner.instance == a.name and c.at > stopped_at
        ]

    await eventually(landed, within=LATE + 10)
    late = landed()[0]
    # The current owner's budgets and etcd's memory once its own repair has ended, with the
    # stale command refused on the host and its sender still frozen: on a loaded machine the
    # repair can still be running when the stale command lands, and its outcome is no part
    # of what the refusal may not change.
    if fencing:
        await wait_healthy(b, within=60)
        await two_more_looks(b, within=30)
    b_before = await budgets(b, cluster)
    stored_before = await attempts_in_etcd(admin, cluster)
    a.signal(signal.SIGCONT)
    by_b = [c for c in seed_world.owned_commands() if c.owner.instance == b.name]
    # The new owner ran its commands before the stale one landed, with a newer token.
    assert by_b and by_b[0].at < late.at and by_b[0].owner.token > late.owner.token
    if not fencing:
        assert not late.refused and late.status == 0
        assert backwards(seed_world), "the checker missed a stale owner's command"
        with pytest.raises(AssertionError, match="after token"):
            await check_invariants(seed_world, [a, b], etcd)
        return
    assert late.status == exits.FENCED_EXIT and late.refused
    assert backwards(seed_world) == []
    # The new owner's first command on each host was the sweep, before anything it changed.
    for host in {c.host for c in by_b}:
        mine = [c for c in by_b if c.host == host]
        assert mine[0].command.endswith("true\n} 9>&-"), mine[0].command[-80:]
    # The stale command changed nothing: no docker call on the worker came with it.
    assert not [r for r in mutations(seed_world, "spark-b", since=late.at) if r.at < late.at + 0.5]

    async def a_standby() -> bool:
        return await a.role(cluster) == "standby"

    await eventually(a_standby, within=15)
    # Woken, it never started another action.
    assert [s for s, _ in a.intervals(time.time()) if s > stopped_at] == []

    def ended() -> list[dict[str, Any]]:
        return [e for e in a.events() if e.get("event") == "action" and stamp(e) > stopped_at]

    # The action it was frozen in ends with the host's answer, not with its own timeout.
    await eventually(ended, within=15)
    assert [(e["result"], e["detail"].split(":")[0]) for e in ended()] == [("skipped", "fenced")]
    # It heard the refusal: an event and the counter say so ...
    fenced = [e for e in a.events() if e.get("event") == "fenced" and stamp(e) > stopped_at]
    assert fenced and {e.get("host") for e in fenced} == {"spark-b"}, fenced
    shown = json.loads(await get(a, f"/events?cluster={cluster}"))["events"]
    assert [e["host"] for e in shown if e["kind"] == "fenced"] == ["spark-b"]
    assert (await a.metrics())["sparkd_ha_fenced_total"] == 1
    # ... and the refusal spent nothing: in its own accounting the attempt charged before
    # sending is given back (the restart was skipped, not failed), and nothing else changed;
    # nor in the current owner's, nor in etcd's memory. (The attempt it charged in etcd before
    # sending was in flight at the takeover: counted then, as its outcome was unknown to the
    # new owner.)
    refused_kind = ended()[0]["action"]
    assert await budgets(a, cluster) == {**charged, refused_kind: charged[refused_kind] + 1}
    assert await budgets(b, cluster) == b_before
    # Each write stores an attempt's age at that write (sparkd.core.remembering.handover), so a
    # later write by the current owner may restate the ages: the attempts themselves must be the
    # same.
    assert what_was_tried(await attempts_in_etcd(admin, cluster)) == what_was_tried(stored_before)
    # Frozen inside its action, the old owner's own log shows it acting until it woke.
    checked = await check_invariants(seed_world, [a, b], etcd, own_spans=False)
    assert checked.ran > 0 and checked.refused >= 1 and checked.attempts >= 1, checked


async def test_a_rebuilt_etcd_fails_closed_until_refenced(
    seed_world: World, etcd: EtcdServer, tmp_path: Path
) -> None:
    """The hosts' records come from another etcd (this one is
    fresh under running hosts). The owner acts on none of them and says so in its metrics;
    `sparkd ha refence` gives them the owner's token, and the owner then acts."""
    from sparkd.shell.catalogue.fence import FenceToken

    cluster = cluster_name(seed_world)
    for host in ("spark-a", "spark-b"):
        old = catalogue.fence.fence_sweep(FenceToken(cluster, 90210, 1, "ops-old"), 5).command
        status, _, err = await seed_world.host(host).ssh.run_local(old)
        assert status == 0, err
    a = Instance("ops-a", seed_world, etcd, tmp_path)
    try:
        await a.start()

        async def refused() -> bool:
            found = await a.metrics() if await a.role(cluster) == "owner" else {}
            return found.get(f'sparkd_ha_fence_mismatch{{cluster="{cluster}"}}') == 2

        await eventually(refused, within=30)
        await asyncio.sleep(2)  # several cycles: the cold start it would make is held
        assert mutations(seed_world) == []
        assert any(e.get("event") == "fence_mismatch" for e in a.events())
        shown = await asyncio.create_subprocess_exec(
            *SPARKD, "ha", "refence", cluster, "--config", str(a.config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await shown.communicate()
        assert shown.returncode == 0, err.decode()
        assert f"{cluster}: 2 of 2 hosts refenced with token" in out.decode()
        assert "(owner ops-a)" in out.decode()

        async def acting() -> bool:
            return bool(mutations(seed_world))

        await eventually(acting, within=30)

        # The cycle's sweeps run on both hosts at once and refence reaches them one after the
        # other: a sweep may take the first host's new record while the second still refuses,
        # and the owner acts on the swept host alone. The gauge clears at the next sweep.
        async def cleared() -> bool:
            found = await a.metrics()
            return found.get(f'sparkd_ha_fence_mismatch{{cluster="{cluster}"}}') == 0

        await eventually(cleared, within=30)
        metrics = await a.metrics()
        token = int(metrics[f'sparkd_ha_token{{cluster="{cluster}"}}'])
        home = Path(seed_world.host("spark-b").state.home)
        record = (home / catalogue.fence.FENCE_DIR / cluster).read_text().split()
        assert record[0] == str(token) and record[2] == "ops-a" and record[1] != "1"
        # The sweeps the hosts refused (exit 77) changed nothing there.
        checked = await check_invariants(seed_world, [a], etcd)
        assert checked.ran > 0 and checked.refused >= 2, checked
    finally:
        await a.stop()


async def test_a_token_planted_above_every_revision_is_undone_by_refence_force(
    seed_world: World, etcd: EtcdServer, tmp_path: Path
) -> None:
    """Whoever holds the hosts' key writes a record with a token no etcd revision will reach:
    every owner is refused there, and a plain refence never replaces a newer token of the same
    etcd. `sparkd ha refence --force` writes the owner's token over it."""
    cluster = cluster_name(seed_world)
    a = Instance("ops-a", seed_world, etcd, tmp_path)
    homes = [Path(seed_world.host(h).state.home) for h in ("spark-a", "spark-b")]
    records = [home / catalogue.fence.FENCE_DIR / cluster for home in homes]
    try:
        await a.start()
        await eventually(lambda: all(r.exists() for r in records), within=30)
        etcd_id = records[0].read_text().split()[1]
        planted = f"{10**17} {etcd_id} ops-evil\n"
        for record in records:
            record.write_text(planted)

        async def refence(*flags: str) -> tuple[int, str]:
            proc = await asyncio.create_subprocess_exec(
                *SPARKD, "ha", "refence", cluster, *flags, "--config", str(a.config),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await proc.communicate()
            assert proc.returncode is not None
            return proc.returncode, out.decode()

        code, out = await refence()
        assert code == 1 and "not refenced" in out, out
        assert str(10**17) not in out and "ops-evil" not in out
        assert [r.read_text() for r in records] == [planted, planted]
        code, out = await refence("--force")
        assert code == 0 and f"{cluster}: 2 of 2 hosts forced with token" in out, out
        for record in records:
            words = record.read_text().split()
            assert words[1] == etcd_id and int(words[0]) < 10**17, words
    finally:
        await a.stop()
