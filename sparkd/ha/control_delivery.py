"""Handing operators' control records (sparkd.ha.control) to the owner's controllers: each new
record once per instance, its revision noted in etcd under the owner's token, so a restarted
owner does not apply it again."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

import structlog

from sparkd.ha.config import HaSpec
from sparkd.ha.control import Control, applied_key, applied_revision, control_key, decode, encode
from sparkd.ha.etcd import EtcdClient, EtcdError, EtcdUnavailable


@dataclass(eq=False)
class ControlDelivery:
    client: EtcdClient
    spec: HaSpec
    log: structlog.stdlib.BoundLogger
    on_control: Callable[[str, int, Control], bool]
    _: KW_ONLY
    # This instance's token for a cluster while it owns it, and the cluster's owner key.
    token: Callable[[str], int | None]
    key: Callable[[str], str]
    # Per cluster, the mod revision of the control record last handed to the controller.
    seen: dict[str, int] = field(default_factory=dict, init=False)

    async def read(self, held: list[str]) -> None:
        """Hand each held cluster's newest control record to its controller, once."""
        for name in set(self.seen) - set(held):
            del self.seen[name]
        if not held:
            return
        try:
            # One read for every cluster: the records are small and few.
            kvs, _ = await self.client.get_prefix(f"{self.spec.prefix}clusters/")
        except (EtcdUnavailable, EtcdError, OSError) as exc:
            # Ownership stands; the records are read again at the next renewal.
            self.log.info("control_unread", error=f"{type(exc).__name__}")
            return
        found = {kv.key: kv for kv in kvs}
        for name in held:
            kv = found.get(control_key(self.spec.prefix, name))
            done = found.get(applied_key(self.spec.prefix, name, self.spec.instance))
            applied = applied_revision(done.value if done is not None else None)
            if kv is None or kv.mod_revision <= max(applied, self.seen.get(name, 0)):
                continue
            try:
                await self.deliver(name, kv.mod_revision, kv.value)
            except (EtcdUnavailable, EtcdError, OSError) as exc:
                # Applied; only its note failed: a restart before the next record reapplies it.
                self.log.info("control_unnoted", cluster=name, error=f"{type(exc).__name__}")

    async def deliver(self, name: str, revision: int, raw: bytes) -> None:
        token = self.token(name)
        # A renewal and the request's own answer may both bring the same record.
        if token is None or revision <= self.seen.get(name, 0):
            return
        control = decode(raw)
        if control is None:
            self.log.error("control_unreadable", cluster=name, revision=revision)
        elif not self.on_control(name, revision, control):
            return  # no controller yet: offered again at the next renewal
        self.seen[name] = revision
        done = str(revision).encode()
        key = applied_key(self.spec.prefix, name, self.spec.instance)
        if not await self.client.put_if_owner(self.key(name), token, key, done):
            self.log.warning("control_applied_unrecorded", cluster=name, token=token)

    async def request(self, cluster: str, control: Control, owned: bool) -> int:
        """Record an operator's pause or resume for `cluster`, applied at once when this
        instance owns it (`owned`); its revision."""
        raw = encode(control)
        revision = await self.client.put(control_key(self.spec.prefix, cluster), raw)
        self.log.info("control_recorded", cluster=cluster, paused=control.paused, by=control.by)
        if owned:
            with contextlib.suppress(EtcdUnavailable, EtcdError, OSError):
                await self.deliver(cluster, revision, raw)
        return revision
