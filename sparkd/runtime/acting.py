"""Who may act on each cluster: one object the daemon is handed and asks, never a condition
spread over it. `Alone` (no `[ha]` section: this box acts, the state dir keeps the events) or
`OnEtcd` (the etcd lease decides, commands carry the host fence, memory and events live in etcd),
after Patroni's `NullWatchdog`: the daemon's code is the same either way. etcd code is imported
only by `OnEtcd`, so without `[ha]` none of it is loaded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from sparkd.core.text import printable
from sparkd.model.cluster import ClusterSpec
from sparkd.runtime.controller import Controller
from sparkd.runtime.metrics import Metrics
from sparkd.runtime.state import StateDir
from sparkd.shell.fencing import HostFence
from sparkd.shell.secrets import redact
from sparkd.shell.ssh import SshPool

if TYPE_CHECKING:
    from sparkd.ha.claim import Role
    from sparkd.ha.config import HaSpec
    from sparkd.ha.control import Control
    from sparkd.ha.ownership import Ownership
    from sparkd.runtime.ha_store import EtcdStore


class Acting(Protocol):
    """What the daemon asks about acting, whether or not there is an `[ha]` section."""

    @property
    def ha(self) -> Ownership | None:
        """The etcd side, for the API's HA answers; None without `[ha]`."""
        ...

    @property
    def store(self) -> EtcdStore | None:
        """Where memory lives beside the state dir; None without `[ha]`."""
        ...

    def track(self, cluster: ClusterSpec, pool: SshPool) -> HostFence | None:
        """A cluster to act on from now (at start, or added by a reload); the host fence its
        mutating commands go through, if any."""
        ...

    def untrack(self, cluster_name: str) -> None:
        """A cluster a reload removed."""
        ...

    def may_act(self, cluster_name: str) -> bool: ...

    def role(self, cluster_name: str) -> Role | None:
        """`owner`, `standby` or `no etcd`; None without `[ha]`."""
        ...

    def status(self) -> dict[str, object] | None: ...

    def start(self, stack: contextlib.AsyncExitStack) -> None:
        """Begin contending (after the API is bound), undone by `stack` in reverse."""
        ...

    def close_memory(self, stack: contextlib.AsyncExitStack) -> None:
        """Let memory written behind land at stop: pushed after the controllers' stop."""
        ...

    async def read_events(
        self, limit: int, cluster: str | None
    ) -> tuple[list[dict[str, Any]], int]: ...

    def memory_current(self, cluster_name: str) -> bool: ...


class Alone:
    """No `[ha]`: this box alone acts on its clusters; the state dir's lock keeps a second
    daemon on the box out."""

    def __init__(self, state: StateDir) -> None:
        self.state = state

    @property
    def ha(self) -> Ownership | None:
        return None

    @property
    def store(self) -> EtcdStore | None:
        return None

    def track(self, cluster: ClusterSpec, pool: SshPool) -> HostFence | None:
        return None

    def untrack(self, cluster_name: str) -> None:
        return None

    def may_act(self, cluster_name: str) -> bool:
        return True

    def role(self, cluster_name: str) -> Role | None:
        return None

    def status(self) -> dict[str, object] | None:
        return None

    def start(self, stack: contextlib.AsyncExitStack) -> None:
        return None

    def close_memory(self, stack: contextlib.AsyncExitStack) -> None:
        return None

    async def read_events(
        self, limit: int, cluster: str | None
    ) -> tuple[list[dict[str, Any]], int]:
        # Off the event loop: a slow disk or a long file must not stall every cluster's cycle.
        return await asyncio.to_thread(self.state.read_events_counted, limit, cluster)

    def memory_current(self, cluster_name: str) -> bool:
        return True


class OnEtcd:
    """`[ha]`: the etcd lease decides who acts, what it hears from etcd reaches the controllers
    (`controllers`, the daemon's own mapping, read at each call: reloads change it)."""

    def __init__(
        self,
        spec: HaSpec,
        names: list[str],
        state: StateDir,
        metrics: Metrics,
        controllers: Mapping[str, Controller],
    ) -> None:
        from sparkd.ha.metrics import HaCollector
        from sparkd.ha.ownership import Ownership
        from sparkd.runtime.ha_store import EtcdStore

        self.spec = spec
        self.controllers = controllers
        self.own = Ownership(spec, names, on_change=self._changed, on_control=self._control)
        metrics.registry.register(HaCollector(self.own))
        self.memory = EtcdStore(self.own, state, on_refused=self._refused)

    @property
    def ha(self) -> Ownership | None:
        return self.own

    @property
    def store(self) -> EtcdStore | None:
        return self.memory

    def track(self, cluster: ClusterSpec, pool: SshPool) -> HostFence | None:
        own, name = self.own, cluster.name
        own.track(name)
        fence = HostFence(
            cluster,
            pool,
            token=lambda: own.fence(name),
            enforce=self.spec.host_fencing,
            on_mismatch=lambda host, detail: own.mismatch(name, host, detail),
        )

        def fenced(host: str, detail: str) -> None:
            own.fenced(name, host, detail)
            controller = self.controllers.get(name)
            if controller is not None:
                controller.requests.fenced(host, detail)

        fence.on_fenced = fenced
        return fence

    def untrack(self, cluster_name: str) -> None:
        self.own.untrack(cluster_name)

    def may_act(self, cluster_name: str) -> bool:
        return self.own.may_act(cluster_name)

    def role(self, cluster_name: str) -> Role | None:
        return self.own.role(cluster_name)

    def status(self) -> dict[str, object] | None:
        return self.own.status()

    def start(self, stack: contextlib.AsyncExitStack) -> None:
        # After the API is bound: a daemon that cannot serve never contends. Stopped after the
        # actions in flight, so it hands over at once.
        self.own.start()
        stack.push_async_callback(self.own.stop)

    def close_memory(self, stack: contextlib.AsyncExitStack) -> None:
        # After the controllers stop, before the lease goes: the last memory lands.
        stack.push_async_callback(self.memory.close)

    async def read_events(
        self, limit: int, cluster: str | None
    ) -> tuple[list[dict[str, Any]], int]:
        """etcd's journal, the same on every instance."""
        names = [cluster] if cluster is not None else list(self.controllers)
        return await self.memory.read_events(names, limit)

    def memory_current(self, cluster_name: str) -> bool:
        return self.memory.current(cluster_name)

    def _refused(self, cluster_name: str, detail: str) -> None:
        # etcd refused a write guarded by the token: the fenced host's path.
        self.own.fenced(cluster_name, "etcd", detail)
        controller = self.controllers.get(cluster_name)
        if controller is not None:
            controller.requests.fenced("etcd", detail)

    def _changed(self, cluster_name: str) -> None:
        # Acquired or lost: look now, so an owner acts at once and a former one stops.
        controller = self.controllers.get(cluster_name)
        if controller is not None:
            controller.wake.set()

    def _control(self, cluster_name: str, revision: int, control: Control) -> bool:
        # An operator's pause or resume from any instance's API, read from etcd by the owner.
        controller = self.controllers.get(cluster_name)
        if controller is None:
            return False
        store = self.memory
        if not store.current(cluster_name):
            return False  # offered again once the memory from etcd is in
        if store.took(cluster_name, revision):
            return True  # a former owner applied it to the memory this one continues
        # Anyone with etcd access may have written it: shown on operators' terminals.
        by = printable(redact(control.by))
        controller.log.info("control", revision=revision, paused=control.paused, by=by)
        if control.paused:
            controller.requests.pause(printable(redact(control.reason)), by, control.until)
        else:
            controller.requests.resume(by)
        store.applied(cluster_name, revision)
        return True
