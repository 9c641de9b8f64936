"""Ownership rules against a real etcd: create-if-absent, renewal checks, the BOOTTIME
deadline, unknown outcomes, re-adoption, graceful release and takeover."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from structlog.testing import capture_logs

from sparkd.ha.etcd import Acquired, EtcdClient, EtcdUnavailable
from sparkd.ha.ownership import Ownership, boottime
from tests.etcd.conftest import EtcdServer, lease_remaining
from tests.support.ha import Clock, spec, wait_for

pytestmark = pytest.mark.etcd
# Imported from here before they moved to tests/support/ha.py.
__all__ = ["Clock", "spec", "wait_for"]


async def test_one_owner_and_a_standby(etcd: EtcdServer, admin: EtcdClient) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"])
    b = Ownership(spec(etcd, "b"), ["c1"])
    try:
        await a.round()
        await b.round()
        assert (a.role("c1"), b.role("c1")) == ("owner", "standby")
        kv, _ = await admin.get("test/v1/owner/c1")
        assert kv is not None and kv.create_revision == a.token("c1")
        assert json.loads(kv.value)["instance"] == "a"
        assert b.status()["clusters"] == {"c1": {"role": "standby", "token": None, "holder": "a"}}
    finally:
        await a.stop()
        await b.stop()


async def test_graceful_stop_hands_over_at_once(etcd: EtcdServer, admin: EtcdClient) -> None:
    # The production timings; how fast the handover is, bench ha measures.
    timings = {"lease_ttl": 15, "renew_interval": 5.0, "request_timeout": 2.0, "margin": 2.0}
    a = Ownership(spec(etcd, "a", **timings), ["c1"])
    await a.round()
    b = Ownership(spec(etcd, "b", **timings), ["c1"])
    # The standby never renews on its own: only hearing the deletion can make it try again.
    b.spec = b.spec.model_copy(update={"renew_interval": 3600.0})
    b.start()
    try:
        await wait_for(lambda: b.reachable and b.revision > 0, 15)
        old, lease = a.token("c1"), a.lease
        assert old is not None and lease is not None
        left = await lease_remaining(admin, lease)
        assert left > 0
        await a.stop()
        # The release itself deleted the key: a's lease is gone long before it could expire.
        assert await lease_remaining(admin, lease) == -1
        kv, _ = await admin.get("test/v1/owner/c1")
        assert kv is None or kv.lease == b.lease
        await wait_for(lambda: b.may_act("c1"), left)
        token = b.token("c1")
        assert token is not None and token > old
        assert b.takeovers == 1
    finally:
        await b.stop()


async def test_a_silent_owner_is_taken_over_after_its_ttl(etcd: EtcdServer) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"])
    b = Ownership(spec(etcd, "b"), ["c1"])
    await a.round()
    old = a.token("c1")
    b.start()
    try:
        # a never renews again (as if killed): its deadline passes before etcd drops the key.
        took = await wait_for(lambda: b.may_act("c1"), 3 + 1.5)
        assert not a.may_act("c1")
        assert took >= 3 - 1.0 - 0.2, took  # not before the lease could have run out
        token = b.token("c1")
        assert old is not None and token is not None and token > old
    finally:
        await b.stop()
        await a.client.close()


async def test_may_act_ends_at_the_deadline_not_the_next_renewal(etcd: EtcdServer) -> None:
    clock = Clock()
    a = Ownership(spec(etcd, "a"), ["c1"], clock=clock)
    try:
        before = clock()
        await a.round()
        after = clock()
        deadline = a.deadline()
        assert deadline is not None
        # Counted from the send, not the answer: 3 s granted, 1 s margin.
        assert before + a.granted - 1.0 <= deadline <= after + a.granted - 1.0
        assert a.may_act("c1")
        clock.skip = deadline - clock() + 0.001  # a suspend past the deadline
        assert not a.may_act("c1")
        assert a.role("c1") == "standby"
    finally:
        await a.stop()


@pytest.mark.parametrize("jump", [-86400.0, 86400.0], ids=["back a day", "ahead a day"])
async def test_a_wall_clock_jump_does_not_move_the_deadline(etcd: EtcdServer, jump: float) -> None:
    """The owner's deadline is on CLOCK_BOOTTIME; a wall clock that steps
    (NTP, `date -s`) between renewals neither extends nor ends its right to act."""
    wall = {"now": time.time()}
    a = Ownership(spec(etcd, "a"), ["c1"], wall_clock=lambda: wall["now"])
    try:
        before = boottime()
        await a.round()
        first = a.deadline()
        assert first is not None and a.may_act("c1")
        wall["now"] += jump
        assert a.may_act("c1") and a.deadline() == first
        await a.round()
        after = boottime()
        deadline = a.deadline()
        assert deadline is not None and a.may_act("c1")
        # Renewed: counted from this round's send on the boot clock, the jump nowhere in it.
        assert first < deadline <= after + a.granted - 1.0
        assert deadline - before < a.granted + 5
    finally:
        await a.stop()


async def test_demotion_timer_fires_at_the_deadline(etcd: EtcdServer) -> None:
    changes: list[tuple[str, float]] = []
    a = Ownership(
        spec(etcd, "a"), ["c1"], on_change=lambda name: changes.append((name, boottime()))
    )
    try:
        await a.round()
        deadline = a.deadline()
        assert deadline is not None
        changes.clear()
        await asyncio.sleep(deadline - boottime() + 0.3)
        assert [name for name, _ in changes] == ["c1"]
        assert 0 <= changes[0][1] - deadline < 0.5  # at the deadline, not a renewal later
        assert not a.may_act("c1")
    finally:
        await a.stop()


async def test_a_renewal_after_the_deadline_within_the_lease_says_it_acts_again(
    etcd: EtcdServer,
) -> None:
    """Past its deadline an owner stops acting; a renewal that still finds the lease and its
    key (a slow etcd, a short stall) lets it act again under the same token, and the log says
    so, so that "stopped acting" is not the last word an operator reads."""
    changes: list[str] = []
    a = Ownership(spec(etcd, "a"), ["c1"], on_change=changes.append)
    try:
        with capture_logs() as logs:
            await a.round()
            token = a.token("c1")
            deadline = a.deadline()
            assert token is not None and deadline is not None
            await asyncio.sleep(deadline - boottime() + 0.2)
            assert not a.may_act("c1")
            changes.clear()
            await a.round()
        assert a.may_act("c1") and a.token("c1") == token
        assert changes == ["c1"]
        said = [(e["event"], e.get("token")) for e in logs if e.get("cluster") == "c1"]
        assert said[-2:] == [("deadline_passed", token), ("acting_again", token)], said
    finally:
        await a.stop()


async def test_a_renewal_does_not_count_once_the_key_moved(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"])
    try:
        await a.round()
        assert a.may_act("c1")
        other, _ = await admin.grant(30)
        await admin.delete("test/v1/owner/c1")
        assert (await admin.create("test/v1/owner/c1", b'{"instance": "x"}', other)).created
        await a.round()  # the keepalive succeeds; the key is no longer a's
        assert a.lease is not None and await admin.keepalive(a.lease) > 0
        assert not a.may_act("c1")
        assert a.status()["clusters"] == {"c1": {"role": "standby", "token": None, "holder": "x"}}
    finally:
        await a.stop()


async def test_an_expired_lease_drops_everything(etcd: EtcdServer, admin: EtcdClient) -> None:
    a = Ownership(spec(etcd, "a"), ["c1", "c2"])
    try:
        await a.round()
        assert a.may_act("c1") and a.may_act("c2")
        assert a.lease is not None
        await admin.revoke(a.lease)
        await a.round()  # keepalive: TTL 0
        assert not a.may_act("c1") and not a.may_act("c2")
        await a.round()  # a new lease, and the keys again, with new tokens
        assert a.may_act("c1") and a.may_act("c2")
    finally:
        await a.stop()


class LostAnswer(EtcdClient):
    """The create txn reaches etcd, its answer never comes back."""

    lose = True

    async def create(self, key: str, value: bytes, lease: int) -> Acquired:
        answer = await super().create(key, value, lease)
        if self.lose:
            raise EtcdUnavailable("timed out")
        return answer


async def test_an_unknown_acquire_never_counts_then_is_readopted(
    etcd: EtcdServer, admin: EtcdClient
) -> None:
    s = spec(etcd, "a")
    client = LostAnswer([etcd.url], timeout=2)
    a = Ownership(s, ["c1"], client=client)
    try:
        await a.round()
        assert not a.may_act("c1") and a.renew_failures == 1
        kv, _ = await admin.get("test/v1/owner/c1")
        assert kv is not None and kv.lease == a.lease
        client.lose = False
        await a.round()
        assert a.may_act("c1") and a.token("c1") == kv.create_revision
    finally:
        await a.stop()


async def test_no_etcd(etcd: EtcdServer) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"])
    try:
        await a.round()
        token = a.token("c1")
        etcd.kill()
        await a.round()
        assert not a.reachable and a.renew_failures == 1
        # Until the deadline the owner still acts; then it says why it does not.
        assert a.role("c1") == "owner"
        deadline = a.deadline()
        assert deadline is not None
        await asyncio.sleep(deadline - boottime() + 0.05)
        assert a.role("c1") == "no etcd"
        etcd.start()
        # etcd restarts every lease's countdown: the key, still bound to a's lease, is a's.
        await a.round()
        assert a.role("c1") == "owner" and a.token("c1") == token
    finally:
        await a.stop()


async def test_a_standby_stays_one_through_a_lost_round_until_its_deadline(
    etcd: EtcdServer,
) -> None:
    # A round lost to a timeout (a re-authentication slower than request_timeout, a stalled
    # leader) is no more a role change for a standby than for an owner: both keep their role
    # until the deadline of their last good round, then say "no etcd".
    a = Ownership(spec(etcd, "a"), ["c1"])
    b = Ownership(spec(etcd, "b"), ["c1"])
    try:
        await a.round()
        await b.round()
        assert b.role("c1") == "standby"
        etcd.kill()
        await b.round()
        assert not b.reachable and b.status()["etcd"] == "unreachable"
        assert b.role("c1") == "standby"
        deadline = b.deadline()
        assert deadline is not None
        await asyncio.sleep(deadline - boottime() + 0.05)
        assert b.role("c1") == "no etcd"
    finally:
        await a.stop()
        await b.stop()


class Surprising(EtcdClient):
    async def keepalive(self, lease: int) -> int:
        raise RuntimeError("something nobody foresaw")


async def test_the_renewals_outlive_a_surprise(etcd: EtcdServer) -> None:
    a = Ownership(spec(etcd, "a"), ["c1"], client=Surprising([etcd.url], timeout=0.5))
    a.start()
    try:
        await wait_for(lambda: a.may_act("c1"), 3)  # the grant works; keepalives raise
        await wait_for(lambda: a.renew_failures >= 2, 4)
        assert not a._tasks[0].done()
        await wait_for(lambda: not a.may_act("c1"), 3)  # its deadline still ends it
        assert a.role("c1") == "no etcd"
    finally:
        await a.stop()
