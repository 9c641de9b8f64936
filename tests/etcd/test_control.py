"""An operator's pause or resume through etcd: recorded by any instance, applied by the owner
(once, heard through its watch), honoured by the next owner after a takeover; a `blocked`
latch crosses a takeover too, and a resume from another box's CLI clears it."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd.ha.control import Control
from sparkd.ha.etcd import EtcdClient, EtcdUnavailable
from sparkd.ha.ownership import Ownership
from sparkd_sim.owned import OwnedCommand
from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer
from tests.support.daemon import eventually, mutations
from tests.support.ha import (
    TTL,
    Instance,
    check_invariants,
    check_never_two_actors,
    check_one_actor_per_cluster,
    cli,
    cluster_name,
    get,
    operator_token,
    owner_and_standby,
    paused_by,
    spec,
    start_owner_and_standby,
    wait_for,
    wait_healthy,
)

pytestmark = pytest.mark.etcd

KINDS = ("blocked", "resumed")
PRODUCTION = {"lease_ttl": 15, "renew_interval": 5.0, "request_timeout": 2.0, "margin": 2.0}


class Taken:
    """A controller stand-in: the control records handed to it, in order."""

    def __init__(self) -> None:
        self.records: list[tuple[str, int, Control]] = []

    def __call__(self, cluster: str, revision: int, control: Control) -> bool:
        self.records.append((cluster, revision, control))
        return True


async def test_a_standby_records_a_pause_the_owner_takes_once_and_its_successor_too(
    etcd: EtcdServer,
) -> None:
    to_a, to_b = Taken(), Taken()
    a = Ownership(spec(etcd, "a", **PRODUCTION), ["c1"], on_control=to_a)
    b = Ownership(spec(etcd, "b", **PRODUCTION), ["c1"], on_control=to_b)
    await a.round()
    # The owner never renews on its own: only its watch can bring the record in time.
    a.spec = a.spec.model_copy(update={"renew_interval": 3600.0})
    a.start()
    try:
        await b.round()
        assert (a.role("c1"), b.role("c1")) == ("owner", "standby")
        pause = Control(paused=True, reason="cabling", by="ops", at=time.time())
        revision = await b.request("c1", pause)
        await wait_for(lambda: bool(to_a.records), 10)
        assert to_a.records == [("c1", revision, pause)]
        await a.round()
        await a.round()
        assert len(to_a.records) == 1, "handed over again"
        assert to_b.records == [], "a standby applied it"

        await a.stop()
        await b.round()  # the owner key is gone: b acquires and reads the record
        assert b.may_act("c1")
        assert to_b.records == [("c1", revision, pause)]
        resume = Control(paused=False, by="ops", at=time.time())
        later = await b.request("c1", resume)
        await b.round()
        assert to_b.records[-1] == ("c1", later, resume) and later > revision
    finally:
        await a.stop()
        await b.stop()


async def test_a_restarted_owner_does_not_apply_a_record_again(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    taken = Taken()
    a = Ownership(spec(etcd, "a"), ["c1"], on_control=taken)
    await a.round()
    resume = Control(paused=False, by="ops", at=time.time())
    revision = await a.request("c1", resume)  # the owner itself was asked: applied at once
    assert taken.records == [("c1", revision, resume)]
    applied, _ = await admin.get("test/v1/clusters/c1/control_applied/a")
    assert applied is not None and int(applied.value) == revision
    await a.stop()
    # The same instance, restarted on the same state dir: its memory took that resume already.
    again = Taken()
    a2 = Ownership(spec(etcd, "a"), ["c1"], on_control=again)
    try:
        await a2.round()
        assert a2.may_act("c1")
        assert again.records == []
    finally:
        await a2.stop()


async def test_a_former_owner_cannot_mark_a_record_applied(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"])
    await a.round()
    old = a.token("c1")
    assert old is not None
    await admin.delete("test/v1/owner/c1")
    b = Ownership(spec(etcd, "b"), ["c1"])
    try:
        await b.round()
        assert b.may_act("c1")
        # a has not noticed yet; its write is compared on its token and changes nothing.
        assert not await a.client.put_if_owner(
            "test/v1/owner/c1", old, "test/v1/clusters/c1/control_applied/a", b"99"
        )
        kv, _ = await admin.get("test/v1/clusters/c1/control_applied/a")
        assert kv is None
    finally:
        await a.stop()
        await b.stop()


class AnsweredLate(EtcdClient):
    """A put whose answer comes back only after the owner's next renewal has read the record."""

    owner: Ownership | None = None

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        revision = await super().put(key, value, lease)
        if self.owner is not None and "/control" in key:
            await self.owner.round()
        return revision


async def test_a_request_answered_after_a_renewal_read_it_is_applied_once(
    etcd: EtcdServer,
) -> None:
    taken = Taken()
    client = AnsweredLate([etcd.url], timeout=2)
    a = Ownership(spec(etcd, "a"), ["c1"], client=client, on_control=taken)
    client.owner = a
    try:
        await a.round()
        revision = await a.request("c1", Control(paused=True, reason="x", at=time.time()))
        assert [r for _, r, _ in taken.records] == [revision]
    finally:
        await a.stop()


async def test_a_record_sparkd_did_not_write_is_not_applied(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    taken = Taken()
    a = Ownership(spec(etcd, "a"), ["c1"], on_control=taken)
    try:
        await a.round()
        for raw in (b"{not json", b'{"paused": true, "at": 1, "reason": "' + b"x" * 5000 + b'"}'):
            await admin.put("test/v1/clusters/c1/control", raw)
            await a.round()
        assert taken.records == []
        assert a.may_act("c1")  # ownership unaffected
        revision = await a.request("c1", Control(paused=True, reason="ok", at=time.time()))
        assert [r for _, r, _ in taken.records] == [revision]
    finally:
        await a.stop()


async def test_a_request_without_etcd_is_refused(etcd: EtcdServer) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"])
    try:
        await a.round()
        etcd.kill()
        with pytest.raises(EtcdUnavailable):
            await a.request("c1", Control(paused=True, reason="x", at=time.time()))
    finally:
        await a.stop()


@pytest.fixture
async def operated(
    seed_world: World, etcd: EtcdServer, tmp_path: Path
) -> AsyncIterator[tuple[Instance, Instance]]:
    """Two instances whose control endpoints are on, with the same operator token."""
    token = operator_token(tmp_path)
    a = Instance("ops-a", seed_world, etcd, tmp_path, token_file=token)
    b = Instance("ops-b", seed_world, etcd, tmp_path, token_file=token)
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


async def test_pause_from_the_standby_holds_across_a_takeover_and_resume_ends_it(
    seed_world: World, operated: tuple[Instance, Instance], etcd: EtcdServer
) -> None:
    a, b, cluster = await owner_and_standby(seed_world, operated)

    await wait_healthy(a, within=90)  # a model to crash later
    code, out = await cli(b, "pause", cluster, "--reason", "swapping a cable")
    assert code == 0, out

    async def a_paused() -> bool:
        return await paused_by(a) == "swapping a cable"

    await eventually(a_paused, within=10)
    assert await paused_by(b) is None, "the standby's own memory took it"
    since = time.time()
    await seed_world.fault("crash-model", "spark-a")

    await a.kill()

    async def b_owns_paused() -> bool:
        return await b.role(cluster) == "owner" and await paused_by(b) == "swapping a cable"

    await eventually(b_owns_paused, within=4 * TTL)
    await asyncio.sleep(2)
    assert mutations(seed_world, since=since) == [], "a paused cluster was acted on"

    code, out = await cli(b, "resume", cluster)
    assert code == 0, out

    async def b_repairs() -> bool:
        return await paused_by(b) is None and bool(mutations(seed_world, since=since))

    await eventually(b_repairs, within=60)
    check_never_two_actors(seed_world, a, b)
    assert (await check_invariants(seed_world, [a, b], etcd)).ran > 0

    etcd.kill()
    code, out = await cli(b, "pause", cluster, "--reason", "late")
    assert code != 0 and "no etcd" in out, out


def one_attempt(instance: Instance) -> Instance:
    """The instance's config with a budget of one attempt per target (both instances alike:
    a different config would make one refuse the cluster)."""
    text = re.sub(r"^(\s*)budget = .*$", r"\1budget = 1", instance.config.read_text(), flags=re.M)
    instance.config.write_text(text)
    return instance


async def shown(instance: Instance) -> tuple[str | None, str, int]:
    """The cluster's phase, reason and looks so far, from the instance's /status."""
    clusters = (await instance.status()).get("clusters") or []
    if not clusters:
        return None, "", 0
    return clusters[0]["phase"], clusters[0].get("reason") or "", int(clusters[0]["cycles"])


async def looked(instance: Instance, more: int) -> None:
    """Until the instance has looked at the cluster `more` times from now."""
    _, _, looks = await shown(instance)

    async def done() -> bool:
        return (await shown(instance))[2] >= looks + more

    await eventually(done, within=60)


async def latches_and_resumes(instance: Instance, cluster: str) -> list[tuple[str, str]]:
    """The cluster's `blocked` and `resumed` events in etcd's journal, oldest first, with the
    instance that wrote each (from the instance's /events)."""
    events = json.loads(await get(instance, f"/events?cluster={cluster}&limit=1000"))["events"]
    return [(e["kind"], e["instance"]) for e in reversed(events) if e["kind"] in KINDS]


async def latched(instance: Instance) -> bool:
    phase, reason, _ = await shown(instance)
    return phase == "blocked" and "(latched;" in reason


async def test_a_blocked_latch_crosses_a_takeover_and_the_other_boxs_resume_clears_it(
    seed_world: World, etcd: EtcdServer, tmp_path: Path
) -> None:
    world = seed_world
    token = operator_token(tmp_path)
    a, b = (
        one_attempt(Instance(name, world, etcd, tmp_path, token_file=token))
        for name in ("ops-a", "ops-b")
    )
    cluster = cluster_name(world)
    try:
        await start_owner_and_standby(a, b, cluster)
        await wait_healthy(a, within=90)
        # The model fails every probe: the owner restarts it once, and with its one attempt
        # spent it latches the cluster blocked.
        await world.fault("answer-style", "spark-a", "http_500")
        await eventually(lambda: latched(a), within=90)
        # The model answers again; the latch holds. The standby's own looks, which spent
        # nothing and latched nothing, see the cluster healthy.
        await world.fault("heal", "spark-a")
        await wait_healthy(b, within=60)
        assert await latched(a)

        await a.kill()

        async def b_owns() -> bool:
            return await b.role(cluster) == "owner"

        await eventually(b_owns, within=4 * TTL)
        # The new owner's looks on the healthy cluster show it blocked: the latch came with
        # etcd's memory. Then the model dies, and it still does nothing.
        await looked(b, 3)
        assert await latched(b), await shown(b)
        # The latch it shows is the former owner's, not one of its own making.
        assert await latches_and_resumes(b, cluster) == [("blocked", a.name)]
        await world.fault("crash-model", "spark-a")
        crashed_at = time.time()
        await looked(b, 3)
        assert await latched(b), await shown(b)
        assert mutations(world, since=crashed_at) == [], "a latched cluster was acted on"
        code, out = await cli(b, "status")
        assert code == 0 and re.search(rf"^{cluster}\s+blocked\s.*\(latched;", out, re.M), out

        # The other box, back as a standby, takes the operator's resume.
        await a.start()

        async def a_waits() -> bool:
            return await a.role(cluster) == "standby"

        await eventually(a_waits, within=30)
        asked_at = time.time()
        code, out = await cli(a, "resume", cluster)
        assert code == 0, out

        def relaunched() -> list[OwnedCommand]:
            return [
                c
                for c in world.owned_commands()
                if c.at > asked_at and not c.refused and "vllm serve" in c.command
            ]

        await eventually(relaunched, within=60)
        assert {c.owner.instance for c in relaunched()} == {b.name}
        await wait_healthy(b, within=90)
        code, out = await cli(b, "status")
        assert code == 0 and re.search(rf"^{cluster}\s+healthy\s", out, re.M), out
        assert await latches_and_resumes(b, cluster) == [("blocked", a.name), ("resumed", b.name)]
        assert check_one_actor_per_cluster(world, [a, b]) > 0
    finally:
        await a.stop()
        await b.stop()
