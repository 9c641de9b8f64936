"""Memory and intents in etcd against a real etcd: imported once, written by the owner only
under its token, refused once the key moved on, and read by a new owner with every grace kept
and the former owner's unfinished action named."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sparkd.ha.etcd import EtcdClient
from sparkd.ha.memory import intent_key, memory_key
from sparkd.model.memory import Attempt, Blocked, ClockAnchor, LoadMark, Memory, Pause
from sparkd.model.plan import Action
from tests.etcd.conftest import EtcdServer
from tests.support.ha import wait_for
from tests.support.store_box import Box, two_boxes

pytestmark = pytest.mark.etcd

PREFIX = "test/v1/"


def remembered(now: float, boot: str) -> Memory:
    """A recovery in progress: one attempt spent, a load's grace running, a latch, a pause."""
    return Memory(
        attempts=(Attempt(key="restart_model:spark-a", at=now - 40.0, ok=False, reason="r"),),
        load_mark=LoadMark(launch=now - 30.0, key="loading", at=now - 10.0),
        blocked=Blocked(reason="kept failing", since=now - 5.0),
        paused=Pause(reason="window", by="op", since=1.7e9, until=None),
        clock=ClockAnchor(boot_id=boot, offset=now - 100.0, mono_at=1.0),
    )


@pytest.fixture
async def boxes(etcd: EtcdServer, tmp_path: Path) -> AsyncIterator[tuple[Box, Box]]:
    # Box b's daemon time runs a day behind box a's: different boots, different anchors.
    a, b = Box(etcd, "a", tmp_path, 2.0e9), Box(etcd, "b", tmp_path, 2.0e9 - 86400.0)
    async with two_boxes(a, b) as pair:
        yield pair


async def test_first_owner_imports_its_memory_only_when_etcd_has_none(
    boxes: tuple[Box, Box], admin: EtcdClient
) -> None:
    a, b = boxes
    await a.ha.round()
    local = remembered(a.now, "boot-a")
    adopted = await a.store.adopt("c1", local, a.now)
    assert adopted is not None and adopted.source == "imported"
    kv, _ = await admin.get(memory_key(PREFIX, "c1"))
    assert kv is not None
    record = json.loads(kv.value)
    assert record["token"] == a.ha.token("c1")
    # Ages at the write, no box's clock: the attempt was 40 s old, the load mark 10 s.
    assert record["memory"]["attempts"][0]["at"] == -40.0
    assert record["memory"]["load_mark"]["at"] == -10.0
    assert record["memory"]["clock"] is None
    # Once owner, adopting again changes nothing; a second owner never imports its own.
    assert await a.store.adopt("c1", local, a.now) is None
    await a.ha.stop()
    await b.ha.round()
    assert b.ha.role("c1") == "owner"
    adopted = await b.store.adopt("c1", Memory(), b.now)
    assert adopted is not None and adopted.source == "etcd"
    memory = adopted.memory
    assert [x.key for x in memory.attempts] == ["restart_model:spark-a"]
    assert memory.attempts[0].at == b.now - 40.0
    assert memory.load_mark is not None and memory.load_mark.at == b.now - 10.0
    assert memory.blocked is not None and memory.paused == local.paused


async def test_a_write_after_the_key_moved_on_is_refused_and_changes_nothing(
    boxes: tuple[Box, Box], admin: EtcdClient
) -> None:
    a, b = boxes
    await a.own(remembered(a.now, "boot-a"))
    old = a.ha.token("c1")
    # a's owner key goes (its lease revoked behind its back); b takes the cluster.
    assert a.ha.lease is not None
    await admin.revoke(a.ha.lease)
    await b.ha.round()
    assert b.ha.role("c1") == "owner"
    # a still believes it owns the cluster until its next renewal: its write is refused.
    assert a.ha.token("c1") == old
    before, _ = await admin.get(memory_key(PREFIX, "c1"))
    a.store.save("c1", Memory(clock=ClockAnchor(boot_id="boot-a", offset=a.offset, mono_at=1.0)))
    await wait_for(lambda: bool(a.refused), within=5)
    after, _ = await admin.get(memory_key(PREFIX, "c1"))
    assert before is not None and after is not None
    assert after.mod_revision == before.mod_revision
    assert "moved on" in a.refused[0]
    action = Action(kind="restart_model", host="spark-a", target="m", reason="r")
    why = await a.store.ready("c1", action)
    assert why is not None
    intent, _ = await admin.get(intent_key(PREFIX, "c1"))
    assert intent is None


async def test_a_claim_lost_before_its_memory_was_read_adopts_nothing(
    boxes: tuple[Box, Box], admin: EtcdClient
) -> None:
    a, b = boxes
    # a claims the cluster and is paused before it reads the memory; its lease runs out and b
    # takes the cluster, recording a launch of its own.
    await a.ha.round()
    old = a.ha.token("c1")
    assert old is not None and a.ha.lease is not None
    await admin.revoke(a.ha.lease)
    await b.ha.round()
    adopted = await b.store.adopt("c1", Memory(), b.now)
    assert adopted is not None
    launched = Attempt(key="start_model:spark-a", at=b.now, ok=True, reason="b's launch")
    b.store.save("c1", adopted.memory.evolve(attempts=(launched,)))
    await b.store.close()
    before, _ = await admin.get(memory_key(PREFIX, "c1"))
    # Woken before its next renewal, a still believes in its token: it must not continue
    # from b's memory as its own, nor take it for current.
    assert a.ha.token("c1") == old
    assert await a.store.adopt("c1", Memory(), a.now) is None
    assert not a.store.current("c1")
    after, _ = await admin.get(memory_key(PREFIX, "c1"))
    assert before is not None and after is not None and after.mod_revision == before.mod_revision


async def test_a_new_owner_finds_the_former_owners_intent(
    boxes: tuple[Box, Box], admin: EtcdClient
) -> None:
    a, b = boxes
    local = remembered(a.now, "boot-a").evolve(blocked=None)
    await a.own(local)
    action = Action(kind="restart_model", host="spark-a", target="m", reason="r")
    charged = local.evolve(
        attempts=(*local.attempts, Attempt(key=action.key, at=a.now, ok=False, reason="r"))
    )
    a.store.save("c1", charged)
    assert await a.store.ready("c1", action) is None
    intent, _ = await admin.get(intent_key(PREFIX, "c1"))
    assert intent is not None and json.loads(intent.value)["token"] == a.ha.token("c1")
    old = a.ha.token("c1")
    # Killed before the outcome: the lease simply runs out.
    assert a.ha.lease is not None
    await admin.revoke(a.ha.lease)
    await b.ha.round()
    adopted = await b.store.adopt("c1", Memory(), b.now)
    assert adopted is not None and adopted.intent is not None
    assert adopted.intent["token"] == old and adopted.intent["action"] == "restart_model"
    # The attempt it charged is there once; the intent is gone from etcd.
    assert [x.key for x in adopted.memory.attempts].count(action.key) == 1
    assert len(adopted.memory.attempts) == 2
    gone, _ = await admin.get(intent_key(PREFIX, "c1"))
    assert gone is None


async def test_the_outcome_clears_the_intent(boxes: tuple[Box, Box], admin: EtcdClient) -> None:
    a, _ = boxes
    local = Memory(clock=ClockAnchor(boot_id="boot-a", offset=a.offset, mono_at=1.0))
    await a.own(local)
    action = Action(kind="restart_model", host="spark-a", target="m", reason="r")
    a.store.save("c1", local)
    assert await a.store.ready("c1", action) is None
    a.store.settled("c1")
    a.store.save("c1", local.evolve(consecutive_failures=1))
    await a.store.close()
    intent, _ = await admin.get(intent_key(PREFIX, "c1"))
    assert intent is None
    kv, _ = await admin.get(memory_key(PREFIX, "c1"))
    assert kv is not None and json.loads(kv.value)["memory"]["consecutive_failures"] == 1


async def test_a_control_record_the_memory_took_is_not_taken_again_by_the_next_owner(
    boxes: tuple[Box, Box], admin: EtcdClient
) -> None:
    a, b = boxes
    local = Memory(clock=ClockAnchor(boot_id="boot-a", offset=a.offset, mono_at=1.0))
    await a.own(local)
    # An operator's resume at revision 41 applied, then a latch set after it.
    a.store.save("c1", local)
    a.store.applied("c1", 41)
    a.store.save("c1", local.evolve(blocked=Blocked(reason="kept failing", since=a.now)))
    await a.store.close()
    assert a.ha.lease is not None
    await admin.revoke(a.ha.lease)
    await b.ha.round()
    assert not b.store.current("c1")
    adopted = await b.store.adopt("c1", Memory(), b.now)
    assert adopted is not None and adopted.memory.blocked is not None
    assert b.store.current("c1")
    # The resume is not applied again over the later latch; a newer record is.
    assert b.store.took("c1", 41)
    assert not b.store.took("c1", 42)
