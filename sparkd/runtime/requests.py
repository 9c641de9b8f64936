"""The controller's memory now, and an operator's requests to it.

`MemoryNow` is the one owner of "memory now": the controller sets what it loaded, vetted and
learnt; an operator's request (pause, resume, a rollout retried or rolled back) edits it at once,
and an edit that lands while a cycle runs is applied again on top of what the cycle learnt, so
the cycle never undoes it.

`OperatorRequests` takes those requests and an HA fence's report: each is applied to memory,
persisted with an event, and the loop woken."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from sparkd.core.deciding import rollout
from sparkd.core.remembering.remember import pause as pause_memory
from sparkd.core.remembering.remember import resume as resume_memory
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.runtime.clock import DaemonClock

Edit = Callable[[Memory], Memory]


class MemoryNow:
    def __init__(self, memory: Memory) -> None:
        self.value = memory
        # The operator's edits since the current look began.
        self._edits: list[Edit] = []

    def edit(self, change: Edit) -> None:
        """An operator's change: applied now, and again on top of what the running cycle
        learns."""
        self.value = change(self.value)
        self._edits.append(change)

    def look_began(self) -> None:
        """The memory a look plans from is read after this: every edit before is in it."""
        self._edits.clear()

    def learnt(self, memory: Memory) -> None:
        """What the cycle learnt so far (from the memory it planned from), with the edits that
        landed while it ran on top: kept until the cycle ends, since each action's outcome is
        learnt anew from that same memory."""
        for change in self._edits:
            memory = change(memory)
        self.value = memory

    def cycle_ended(self) -> None:
        """Every edit so far is in `value`, and the next look plans from it."""
        self._edits.clear()


class OperatorRequests:
    def __init__(
        self,
        memory: MemoryNow,
        cluster: Callable[[], ClusterSpec],
        clock: DaemonClock,
        wall_clock: Callable[[], float],
        log: structlog.stdlib.BoundLogger,
        note: Callable[[str, dict[str, Any]], bool],
        stir: Callable[[], None],
    ) -> None:
        self.memory = memory
        self.cluster = cluster
        self.clock = clock
        self.wall_clock = wall_clock
        self.log = log
        # Persist memory with one event and wake the loop; True when it is on disk.
        self._note = note
        # Something may have changed Ray: the next look reads it anew, and comes at once.
        self._stir = stir

    def pause(self, reason: str, by: str, until: float | None) -> bool:
        """Applied at once; True when it is also on disk."""
        now = self.wall_clock()
        self.memory.edit(lambda m: pause_memory(m, reason=reason, by=by, now=now, until=until))
        self.log.info("paused", by=by, reason=reason, until=until)
        return self._note("paused", {"by": by, "reason": reason, "until": until})

    def resume(self, by: str) -> bool:
        """Applied at once; True when it is also on disk."""
        self.memory.edit(resume_memory)
        self.log.info("resumed", by=by)
        return self._note("resumed", {"by": by})

    def fenced(self, host: str, detail: str) -> None:
        """A host refused this instance's token (HA): another instance owns the cluster now.
        The action is skipped (no budget spent); ownership is already given up."""
        self.log.warning("fenced", host=host, detail=detail)
        self._note("fenced", {"host": host, "detail": detail})

    def rollout_retry(self, by: str) -> bool:
        """Roll the desired spec out again after a rollback; False when none holds."""
        cluster = self.cluster()
        if rollout.retry(self.memory.value, cluster) == self.memory.value:
            return False
        self.memory.edit(lambda m: rollout.retry(m, cluster))
        self.log.info("rollout_retry", by=by)
        self._note("rollout_retry", {"by": by})
        return True

    def rollout_back(self, by: str) -> bool:
        """Go to the last-good spec now; False when there is none other than the desired."""
        cluster, now, wall = self.cluster(), self.clock.now(), self.wall_clock()
        edited = rollout.back(self.memory.value, cluster, by, now, wall)
        if edited == self.memory.value:
            return False
        # The spec the operator asked to go back to: a cycle running now may accept the rollout
        # and make the new spec last-good before this edit is applied on top of it.
        good = self.memory.value.last_good
        self.memory.edit(lambda m: rollout.back(m, cluster, by, now, wall, good))
        self.log.info("rollout_back", by=by)
        self._note("rollout_back", {"by": by})
        return True

    def reconcile(self, by: str) -> None:
        self.log.info("reconcile_requested", by=by)
        self._stir()
