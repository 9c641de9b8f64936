"""What the web layer needs of the daemon, and nothing more: the API is typed against this, not
against `runtime.daemon.Daemon`, so the daemon can serve it without the two importing each
other (the daemon satisfies it structurally)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from aiohttp import web

if TYPE_CHECKING:
    from sparkd.ha.ownership import Ownership
    from sparkd.runtime.controller import Controller
    from sparkd.runtime.metrics import Metrics
    from sparkd.runtime.state import StateDir
    from sparkd.settings import Settings


class DaemonApi(Protocol):
    """The daemon as the API sees it: read-only, except through its controllers' requests."""

    @property
    def settings(self) -> Settings: ...

    @property
    def controllers(self) -> Mapping[str, Controller]: ...

    @property
    def state(self) -> StateDir: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def log(self) -> structlog.stdlib.BoundLogger: ...

    @property
    def started_at(self) -> float: ...

    @property
    def ha(self) -> Ownership | None:
        """Set only with an [ha] section."""
        ...

    async def read_events(
        self, limit: int, cluster: str | None
    ) -> tuple[list[dict[str, Any]], int]:
        """The newest events, newest first, and how many unreadable records were skipped."""
        ...

    def memory_current(self, cluster: str) -> bool:
        """Whether an operator's edit of the cluster's memory would be kept: always without
        [ha]; with it, once this owner continues from the memory in etcd."""
        ...

    def health(self) -> dict[str, Any]:
        """The /healthz body; its status is "ok" or "unhealthy"."""
        ...


DAEMON: web.AppKey[DaemonApi] = web.AppKey("daemon")
