"""The daemon's side of [ha] (sparkd.ha): ownership made and wired to the controllers, and
what etcd tells them. etcd code is imported only here, and only with an [ha] section."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from sparkd.core.text import printable
from sparkd.runtime.controller import Controller
from sparkd.runtime.metrics import Metrics
from sparkd.runtime.state import StateDir
from sparkd.settings import Settings
from sparkd.shell.secrets import redact

if TYPE_CHECKING:
    from sparkd.ha.control import Control
    from sparkd.ha.ownership import Ownership
    from sparkd.runtime.ha_store import EtcdStore


class HaWiring:
    # The daemon's state these use (set in its __init__).
    settings: Settings
    state: StateDir
    metrics: Metrics
    controllers: dict[str, Controller]
    ha: Ownership | None
    memory_store: EtcdStore | None

    def _make_ha(self) -> None:
        # etcd code only here, and only with an [ha] section.
        from sparkd.ha.metrics import HaCollector
        from sparkd.ha.ownership import Ownership
        from sparkd.runtime.ha_store import EtcdStore

        assert self.settings.ha is not None
        names = [c.name for c in self.settings.clusters]
        self.ha = Ownership(
            self.settings.ha,
            names,
            on_change=self._ha_changed,
            on_control=self._ha_control,
            fingerprint=self._fingerprint(self.settings),
            # Instances started together register before any contends: no handoffs needed.
            settle=float(self.settings.ha.lease_ttl),
            quiet=self._ha_quiet,
        )
        self.metrics.registry.register(HaCollector(self.ha))
        self.memory_store = EtcdStore(self.ha, self.state, on_refused=self._ha_refused)
        self.ha.before_handoff = self.memory_store.flush

    async def read_events(
        self, limit: int, cluster: str | None
    ) -> tuple[list[dict[str, Any]], int]:
        """The newest `limit` events (of one cluster or all) and the unreadable records met:
        the state dir's journal, or with [ha] etcd's, the same on every instance. Off the event
        loop for the file: a slow disk or a long file must not stall every cluster's cycle."""
        if self.memory_store is None:
            return await asyncio.to_thread(self.state.read_events_counted, limit, cluster)
        names = [cluster] if cluster is not None else list(self.controllers)
        return await self.memory_store.read_events(names, limit)

    def memory_current(self, cluster_name: str) -> bool:
        return self.memory_store is None or self.memory_store.current(cluster_name)

    def _ha_refused(self, cluster_name: str, detail: str) -> None:
        # etcd refused a write guarded by the token: the fenced host's path.
        assert self.ha is not None
        self.ha.fenced(cluster_name, "etcd", detail)
        controller = self.controllers.get(cluster_name)
        if controller is not None:
            controller.fenced("etcd", detail)

    @staticmethod
    def _fingerprint(settings: Settings) -> str:
        from sparkd.ha.shard import fingerprint

        return fingerprint(c.model_dump(mode="json") for c in settings.clusters)

    def _ha_quiet(self, cluster_name: str) -> bool:
        # A handoff waits for a settled cluster: no action in flight, no grace window open.
        from sparkd.ha.shard import SETTLED_PHASES

        controller = self.controllers.get(cluster_name)
        if controller is None:
            return True
        plan = controller.view.plan
        return (
            controller.view.in_flight is None
            and plan is not None
            and not plan.actions
            and plan.phase in SETTLED_PHASES
        )

    def _ha_changed(self, cluster_name: str) -> None:
        # Acquired or lost: look now, so an owner acts at once and a former one stops.
        controller = self.controllers.get(cluster_name)
        if controller is not None:
            controller.wake.set()

    def _ha_control(self, cluster_name: str, revision: int, control: Control) -> bool:
        # An operator's pause or resume from any instance's API, read from etcd by the owner.
        controller = self.controllers.get(cluster_name)
        if controller is None:
            return False
        store = self.memory_store
        if store is not None:
            if not store.current(cluster_name):
                return False  # offered again once the memory from etcd is in
            if store.took(cluster_name, revision):
                return True  # a former owner applied it to the memory this one continues
        # Anyone with etcd access may have written it: shown on operators' terminals.
        by = printable(redact(control.by))
        controller.log.info("control", revision=revision, paused=control.paused, by=by)
        if control.paused:
            controller.pause(printable(redact(control.reason)), by, control.until)
        else:
            controller.resume(by)
        if store is not None:
            store.applied(cluster_name, revision)
        return True
