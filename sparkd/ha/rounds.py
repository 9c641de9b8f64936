"""What a renewal round does besides renewing (sparkd.ha.ownership): give back the clusters no
longer this instance's share, and hear between rounds what should not wait for the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from sparkd.ha.claim import Claim
from sparkd.ha.config import HaSpec
from sparkd.ha.control import control_key
from sparkd.ha.etcd import EtcdClient
from sparkd.ha.peers import Peers


class Rounds:
    # Ownership's state these read (set in its __init__).
    spec: HaSpec
    client: EtcdClient
    claims: dict[str, Claim]
    peers: Peers
    log: structlog.stdlib.BoundLogger
    on_change: Callable[[str], None]
    quiet: Callable[[str], bool]
    before_handoff: Callable[[str], Awaitable[None]]
    revision: int
    _listed: asyncio.Event
    _poke: asyncio.Event
    _stopping: bool

    def key(self, cluster: str) -> str:
        """The cluster's owner key."""
        return f"{self.spec.prefix}owner/{cluster}"

    async def _share(self, was_deferring: str | None, now: float) -> None:
        """Give back what is no longer this instance's: every cluster while its config differs
        from the others', else at most one whose share moved to another member."""
        peers = self.peers
        if peers.defer_to != was_deferring:
            if peers.defer_to is None:
                self.log.info("config_matches", fingerprint=peers.fingerprint)
            else:
                self.log.error(
                    "config_mismatch", fingerprint=peers.fingerprint, others=peers.defer_to,
                    reason="this instance's clusters or their specs differ from the other "
                    "instances': it refuses every cluster until its config matches theirs",
                )  # fmt: skip
        held = [name for name, claim in self.claims.items() if claim.token is not None]
        if peers.defer_to is not None:
            give = held
        else:
            one = peers.handoff(held, now, self.quiet)
            give = [one] if one is not None else []
        for name in give:
            claim = self.claims[name]
            token = claim.token
            assert token is not None
            to = peers.assigned.get(name) if peers.defer_to is None else None
            # The cluster is settled (no action in flight): what it last remembered lands in
            # etcd under this token, then nothing more is written or started for it.
            await self.before_handoff(name)
            self.log.info("handed_off", cluster=name, token=token, to=to)
            # Before the delete: from here this instance starts nothing more on it.
            claim.token = None
            self.on_change(name)
            if to is not None:
                peers.handed_off(now)
            await self.client.delete_if(self.key(name), token)

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
