"""An operator's requests to a controller (pause, resume, reconcile, a rollout retried or
rolled back) and an HA fence's report: applied to memory at once, persisted with an event,
and the loop woken. A request that lands while a cycle runs is applied again on top of what
the cycle learnt (`_operator_edits`), so the cycle never undoes it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from sparkd.core import rollout
from sparkd.core.remember import pause as pause_memory
from sparkd.core.remember import resume as resume_memory
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.runtime.clock import DaemonClock
from sparkd.runtime.persist import Persistence


class OperatorRequests:
    """The requests half of the controller; the controller sets every attribute below."""

    cluster: ClusterSpec
    memory: Memory
    clock: DaemonClock
    wall_clock: Callable[[], float]
    wake: asyncio.Event
    log: structlog.stdlib.BoundLogger
    persistence: Persistence
    _stirred: bool
    _operator_edits: list[Callable[[Memory], Memory]]

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"at": self.wall_clock(), "cluster": self.cluster.name, "kind": kind, **fields}

    def _note(self, kind: str, **fields: Any) -> bool:
        """Persist memory with one event and wake the loop; True when it is on disk."""
        saved = self.persistence.save(self.memory, [self._event(kind, **fields)])
        self.wake.set()
        return saved

    def _edit(self, edit: Callable[[Memory], Memory]) -> None:
        self.memory = edit(self.memory)
        self._operator_edits.append(edit)

    def pause(self, reason: str, by: str, until: float | None) -> bool:
        """Applied at once; True when it is also on disk."""
        now = self.wall_clock()
        self._edit(lambda m: pause_memory(m, reason=reason, by=by, now=now, until=until))
        self.log.info("paused", by=by, reason=reason, until=until)
        return self._note("paused", by=by, reason=reason, until=until)

    def resume(self, by: str) -> bool:
        """Applied at once; True when it is also on disk."""
        self._edit(resume_memory)
        self.log.info("resumed", by=by)
        return self._note("resumed", by=by)

    def fenced(self, host: str, detail: str) -> None:
        """A host refused this instance's token (HA): another instance owns the cluster now.
        The action is skipped (no budget spent); ownership is already given up."""
        self.log.warning("fenced", host=host, detail=detail)
        self._note("fenced", host=host, detail=detail)

    def rollout_retry(self, by: str) -> bool:
        """Roll the desired spec out again after a rollback; False when none holds."""
        cluster = self.cluster
        if rollout.retry(self.memory, cluster) == self.memory:
            return False
        self._edit(lambda m: rollout.retry(m, cluster))
        self.log.info("rollout_retry", by=by)
        self._note("rollout_retry", by=by)
        return True

    def rollout_back(self, by: str) -> bool:
        """Go to the last-good spec now; False when there is none other than the desired."""
        cluster, now, wall = self.cluster, self.clock.now(), self.wall_clock()
        edited = rollout.back(self.memory, cluster, by, now, wall)
        if edited == self.memory:
            return False
        self._edit(lambda m: rollout.back(m, cluster, by, now, wall))
        self.log.info("rollout_back", by=by)
        self._note("rollout_back", by=by)
        return True

    def reconcile(self, by: str) -> None:
        self.log.info("reconcile_requested", by=by)
        self._stirred = True
        self.wake.set()
