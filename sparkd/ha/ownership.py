"""Who may act on a cluster: one etcd session lease per instance, one owner key per cluster.

The rules (after Patroni and client-go's leader election):

* An owner key `<prefix>owner/<cluster>` is created only if absent, bound to this instance's
  lease, in one transaction. Its create revision is the fencing token: it only ever grows.
* A renewal counts only when etcd granted a positive TTL *and* every owner key this instance
  holds still has its create revision and its lease. Anything else drops the key at once.
* The owner may act only while `now < send time of the last good renewal + granted TTL -
  margin`, on CLOCK_BOOTTIME (it counts a suspend; time.monotonic does not). The lease cannot
  expire at etcd before that instant, because etcd started its countdown after the send. A
  timer is armed at that deadline, so demotion happens there and not at the next renewal.
* A request whose outcome is unknown (a timeout after sending) never counts as acquired. The
  next round reads the key: one bound to this process's own lease is re-adopted (nobody else
  can hold a key bound to it), which also covers an etcd restart that kept the lease.
* A graceful stop revokes the lease: every owner key goes at once and a standby takes over.
* An operator's pause or resume is a control record in etcd (sparkd.ha.control): the owner
  reads it every renewal, hears it through the watch, and hands each new one to its controller.
* Every instance contends for every cluster it lists: one lease per cluster's owner key, the
  first to create it owns it, the others watch. One ops box carries thousands of clusters, so
  nothing spreads them between instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable

import structlog

from sparkd.ha.claim import Claim, Role, boottime
from sparkd.ha.config import HaSpec
from sparkd.ha.control import Control, control_key
from sparkd.ha.control_delivery import ControlDelivery
from sparkd.ha.etcd import EtcdClient, EtcdError, EtcdUnavailable, KeyValue
from sparkd.shell.catalogue.fence import FenceToken

# Why an owner whose deadline passed acts again (`acting_again`): no one else could own it.
AGAIN = "renewed before the lease expired: the same token, still the owner"


class Ownership:
    def __init__(
        self,
        spec: HaSpec,
        clusters: Iterable[str],
        *,
        client: EtcdClient | None = None,
        clock: Callable[[], float] = boottime,
        wall_clock: Callable[[], float] = time.time,
        on_change: Callable[[str], None] = lambda cluster: None,
        on_control: Callable[[str, int, Control], bool] = lambda cluster, revision, c: False,
    ) -> None:
        self.spec = spec
        self.client = client or EtcdClient(
            spec.etcd_endpoints, spec.request_timeout, spec.user, spec.password_file
        )
        self.clock = clock
        self.wall_clock = wall_clock
        self.on_change = on_change
        self.on_control = on_control
        self.claims = {name: Claim(name) for name in clusters}
        self.lease: int | None = None
        self.granted = 0
        # CLOCK_BOOTTIME when the last good renewal was sent.
        self.renewed_at: float | None = None
        # Whether the latest round reached etcd.
        self.reachable = False
        self.renew_failures = 0
        self.takeovers = 0
        # Mutating commands a host refused because a newer owner's token was recorded there.
        self.fenced_total = 0
        self.revision = 0
        self.nonce = secrets.token_hex(8)
        # structlog's logger as runtime.logs configures it (ha sits below runtime).
        self.log: structlog.stdlib.BoundLogger = structlog.get_logger("sparkd").bind(
            component="ha", instance=spec.instance
        )
        self.controls = ControlDelivery(
            self.client, spec, self.log, on_control, token=self.token, key=self.key
        )
        self._poke = asyncio.Event()
        # Set once a round has listed the owner keys: the watch starts from that revision.
        self._listed = asyncio.Event()
        self._stopping = False
        self._timer: asyncio.TimerHandle | None = None
        # Clusters whose deadline passed while still held: a later good renewal says so.
        self._lapsed: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []

    # -- what the controllers ask ---------------------------------------------------------

    def track(self, cluster: str) -> None:
        """A cluster added by a reload: contended for from the next round."""
        self.claims.setdefault(cluster, Claim(cluster))

    def untrack(self, cluster: str) -> None:
        """A cluster a reload removed: stop contending, and give its owner key back."""
        claim = self.claims.pop(cluster, None)
        if claim is None or claim.token is None:
            return
        token = claim.token
        self.log.info("released", clusters=[cluster], reason="no longer configured")
        task = asyncio.get_running_loop().create_task(self._give_back(cluster, token))
        self._tasks.append(task)

    async def _give_back(self, cluster: str, token: int) -> None:
        with contextlib.suppress(EtcdUnavailable, EtcdError, OSError):
            await self.client.delete_if(self.key(cluster), token)

    def key(self, cluster: str) -> str:
        """The cluster's owner key."""
        return f"{self.spec.prefix}owner/{cluster}"

    def deadline(self) -> float | None:
        if self.renewed_at is None:
            return None
        return self.renewed_at + self.granted - self.spec.margin

    def may_act(self, cluster: str) -> bool:
        claim = self.claims.get(cluster)
        deadline = self.deadline()
        return (
            claim is not None
            and claim.token is not None
            and deadline is not None
            and self.clock() < deadline
        )

    def role(self, cluster: str) -> Role:
        """`owner` while it may act; `standby` while its last good round is as recent as an
        owner's would have to be to act (the same deadline: one round lost to a timeout, such
        as a re-authentication that outlived `request_timeout`, changes neither role; the
        instance's `etcd` field says `unreachable` at once); `no etcd` after."""
        if self.may_act(cluster):
            return "owner"
        deadline = self.deadline()
        in_touch = self.reachable or (deadline is not None and self.clock() < deadline)
        return "standby" if in_touch else "no etcd"

    def holder(self, cluster: str) -> str | None:
        """The instance owning `cluster` as last read (this one while it may act)."""
        if self.may_act(cluster):
            return self.spec.instance
        claim = self.claims.get(cluster)
        return claim.holder if claim is not None else None

    def token(self, cluster: str) -> int | None:
        claim = self.claims.get(cluster)
        return claim.token if claim is not None and self.may_act(cluster) else None

    def fence(self, cluster: str) -> FenceToken | None:
        """What this instance's commands on `cluster` carry, while it may act on it."""
        claim = self.claims.get(cluster)
        token = self.token(cluster)
        if claim is None or token is None or claim.etcd_cluster is None:
            return None
        return FenceToken(cluster, token, claim.etcd_cluster, self.spec.instance)

    def fenced(self, cluster: str, host: str, detail: str) -> None:
        """A host refused this instance's token: a newer owner exists. Stop acting at once."""
        self.fenced_total += 1
        claim = self.claims.get(cluster)
        if claim is not None:
            self.log.warning("fenced", cluster=cluster, host=host, token=claim.token, detail=detail)
            self._drop(claim, f"{host} refused token {claim.token}: {detail}")

    def mismatch(self, cluster: str, host: str, detail: str | None) -> None:
        """A host's fence names another etcd (or is unreadable); None once it takes the token."""
        claim = self.claims.get(cluster)
        if claim is None:
            return
        if detail is None:
            claim.mismatched.pop(host, None)
            return
        if host not in claim.mismatched:
            self.log.error("fence_mismatch", cluster=cluster, host=host, detail=detail)
        claim.mismatched[host] = detail

    def lease_remaining(self) -> float:
        """Seconds until this instance's lease may have expired at etcd (0 when none)."""
        if self.renewed_at is None or self.lease is None:
            return 0.0
        return max(0.0, self.renewed_at + self.granted - self.clock())

    def status(self) -> dict[str, object]:
        return {
            "instance": self.spec.instance,
            "etcd": "reachable" if self.reachable else "unreachable",
            "endpoint": self.client.endpoint,
            "lease_remaining_seconds": round(self.lease_remaining(), 3),
            "clusters": {
                name: {
                    "role": self.role(name),
                    "token": self.token(name),
                    "holder": self.holder(name),
                }
                for name, claim in self.claims.items()
            },
        }

    # -- the loop -------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name="ha:renew"),
            asyncio.create_task(self._watch(), name="ha:watch"),
        ]

    async def _run(self) -> None:
        while not self._stopping:
            started = self.clock()
            # Cleared before the round: a deletion heard during it brings the next one at once.
            self._poke.clear()
            try:
                await self.round()
            except Exception:  # the renewals must outlive any surprise; may_act stays bounded
                self.renew_failures += 1
                self.reachable = False
                self.log.exception("renew_round_failed")
            if self._stopping:
                break
            # A lost lease is granted again at once; otherwise the next renewal is due.
            delay = 0.0 if self.lease is None and self.reachable else self.spec.renew_interval
            delay = max(0.0, delay - (self.clock() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), timeout=delay)

    async def round(self) -> None:
        """One renewal (or grant), the check of every held key, and an acquire attempt for
        every cluster nobody holds."""
        sent = self.clock()
        try:
            if self.lease is None:
                await self._grant()
            else:
                ttl = await self.client.keepalive(self.lease)
                if ttl <= 0:
                    self._lost("lease expired")
                    self.reachable = True
                    return
                self.granted = ttl
            await self._check_and_acquire(sent)
        except (EtcdUnavailable, EtcdError, OSError, ValueError, KeyError) as exc:
            self.renew_failures += 1
            was = self.reachable
            self.reachable = False
            log = self.log.warning if was or self.renew_failures == 1 else self.log.info
            log("etcd_unreachable", error=f"{type(exc).__name__}: {exc}")
            for name in self.claims:
                self.on_change(name)
            return
        self.reachable = True
        self._arm()

    async def _grant(self) -> None:
        lease, ttl = await self.client.grant(self.spec.lease_ttl)
        self.lease, self.granted = lease, ttl
        self.log.info("lease_granted", ttl=ttl)

    async def _check_and_acquire(self, sent: float) -> None:
        assert self.lease is not None
        owned = f"{self.spec.prefix}owner/"
        kvs, self.revision = await self.client.get_prefix(owned)
        owners = {kv.key.removeprefix(owned): kv for kv in kvs}
        owners = {name: kv for name, kv in owners.items() if name in self.claims}
        # Ownership stands until the round proves it: a held key that moved is dropped here,
        # before this round's renewal could extend the deadline for it.
        for claim in self.claims.values():
            kv = owners.get(claim.cluster)
            if claim.token is not None and (
                kv is None or kv.create_revision != claim.token or kv.lease != self.lease
            ):
                self._drop(claim, "owner key gone or replaced", kv)
        fresh: list[str] = []
        for name, claim in self.claims.items():
            if claim.token is not None:
                continue
            kv = owners.get(name)
            if kv is not None and kv.lease == self.lease:
                # Bound to this process's own lease: written by an acquire whose answer was lost.
                claim.token = kv.create_revision
                claim.etcd_cluster = self.client.cluster_id
                fresh.append(name)
                self.log.info("readopted", cluster=name, token=claim.token)
                continue
            if kv is not None:
                self._note_holder(claim, kv)
                continue
            value = {
                "instance": self.spec.instance,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "nonce": self.nonce,
                "since": self.wall_clock(),
            }
            answer = await self.client.create(
                self.key(name), json.dumps(value).encode(), self.lease
            )
            if answer.created:
                if claim.holder is not None:
                    self.takeovers += 1
                self.log.info(
                    "acquired", cluster=name, token=answer.revision, was=claim.holder,
                    was_token=claim.holder_token,
                )  # fmt: skip
                claim.token, claim.holder, claim.holder_token = answer.revision, None, None
                claim.etcd_cluster = self.client.cluster_id
                fresh.append(name)
            elif answer.holder is not None:
                self._note_holder(claim, answer.holder)
        self.renewed_at = sent
        self._listed.set()
        for name in sorted(self._lapsed):
            again = self.claims.get(name)
            if again is not None and again.token is not None:
                self.log.info("acting_again", cluster=name, token=again.token, reason=AGAIN)
                self.on_change(name)
        self._lapsed.clear()
        for name in fresh:
            self.on_change(name)
        await self._read_controls()

    async def _watch(self) -> None:
        """A standby hears an owner key's deletion at once instead of at its next renewal, and
        an owner a control record written for it."""
        owners = f"{self.spec.prefix}owner/"
        await self._listed.wait()
        while not self._stopping:
            try:
                if self.revision:
                    async for kind, key in self.client.watch(self.spec.prefix, self.revision + 1):
                        if self._heard(kind, key, owners):
                            self._poke.set()
            except Exception as exc:  # best effort: the renewals re-list every round anyway
                self.log.debug("watch_ended", error=f"{type(exc).__name__}: {exc}")
            # Ended (etcd restarted, compaction) or not yet started: the renewals re-list.
            await asyncio.sleep(self.spec.renew_interval)

    def _heard(self, kind: str, key: str, owners: str) -> bool:
        if kind == "DELETE" and key.startswith(owners):
            claim = self.claims.get(key.removeprefix(owners))
            return claim is not None and claim.token is None
        if kind == "PUT":
            return any(
                claim.token is not None and key == control_key(self.spec.prefix, name)
                for name, claim in self.claims.items()
            )
        return False

    async def offer_controls(self) -> None:
        """Hand the newest control records over now: a new owner, once its memory is in."""
        await self._read_controls()

    async def _read_controls(self) -> None:
        await self.controls.read([n for n, c in self.claims.items() if c.token is not None])

    async def request(self, cluster: str, control: Control) -> int:
        """Record an operator's pause or resume for whichever instance owns `cluster`, and apply
        it at once when that is this one; its revision. Raises EtcdUnavailable or EtcdError
        when it was not recorded."""
        revision = await self.controls.request(cluster, control, self.may_act(cluster))
        self._poke.set()
        return revision

    def _note_holder(self, claim: Claim, kv: KeyValue) -> None:
        try:
            holder = str(json.loads(kv.value).get("instance", "?"))
        except (ValueError, AttributeError):
            holder = "?"
        if (claim.holder, claim.holder_token) != (holder, kv.create_revision):
            self.log.info("standby", cluster=claim.cluster, holder=holder, token=kv.create_revision)
        claim.holder, claim.holder_token = holder, kv.create_revision

    def _drop(self, claim: Claim, why: str, kv: KeyValue | None = None) -> None:
        if claim.token is None:
            return
        self.log.warning("demoted", cluster=claim.cluster, token=claim.token, reason=why)
        claim.token = None
        if kv is not None:
            self._note_holder(claim, kv)
        self.on_change(claim.cluster)

    def _lost(self, why: str) -> None:
        self.lease = None
        self.renewed_at = None
        for claim in self.claims.values():
            self._drop(claim, why)

    def _arm(self) -> None:
        """Wake at the deadline, so a controller stops acting there and says so."""
        if self._timer is not None:
            self._timer.cancel()
        deadline = self.deadline()
        if deadline is None:
            return
        delay = max(0.0, deadline - self.clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._expired)

    def _expired(self) -> None:
        self._timer = None
        deadline = self.deadline()
        if deadline is not None and self.clock() < deadline:
            self._arm()  # renewed meanwhile
            return
        held = [c for c in self.claims.values() if c.token is not None]
        for claim in held:
            self._lapsed.add(claim.cluster)
            self.log.warning(
                "deadline_passed", cluster=claim.cluster, token=claim.token,
                reason="no good renewal in time: stopped acting",
            )  # fmt: skip
            self.on_change(claim.cluster)

    async def stop(self) -> None:
        """Release every cluster at once: revoking the lease deletes the owner keys."""
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lease, self.lease = self.lease, None
        self.renewed_at = None
        for claim in self.claims.values():
            claim.token = None
        if lease is not None:
            try:
                await self.client.revoke(lease)
                self.log.info("released", clusters=sorted(self.claims))
            except (EtcdUnavailable, EtcdError, OSError) as exc:
                self.log.warning("release_failed", error=f"{type(exc).__name__}: {exc}")
        await self.client.close()
