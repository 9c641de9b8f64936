"""The controller's persistence queue: memory and events written as each action finishes.

When the state dir cannot be written (a full disk), memory stays in the process, events wait in
a bounded queue, each failure is logged, and the gap is recorded as an event once writing works
again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from sparkd.model.memory import Memory
from sparkd.runtime.state import StateDir
from sparkd.runtime.store import LocalStore, MemoryStore

EVENTS_KEPT = 1000
# Events held in the process while the state dir cannot be written; past this the oldest go
# (counted, logged, and recorded once writing works again).
UNSAVED_EVENTS_KEPT = 1000

Event = dict[str, Any]


class Persistence:
    """Writes one cluster's memory and events; remembers what could not be written."""

    def __init__(
        self,
        state: StateDir,
        cluster: str,
        log: structlog.stdlib.BoundLogger,
        wall_clock: Callable[[], float],
        event: Callable[..., Event],
        *,
        store: MemoryStore | None = None,
    ) -> None:
        self.state = state
        # Where the memory goes: the state dir, or with [ha] etcd (the state dir keeps a copy).
        self.store = store or LocalStore(state)
        self.cluster = cluster
        self.log = log
        self.wall_clock = wall_clock
        self.event = event
        # The latest error (None while writes succeed), since when, and the events not yet
        # written.
        self.error: str | None = None
        self.failed_since: float | None = None
        self.unsaved: list[Event] = []
        self.dropped = 0

    def save(self, memory: Memory, events: list[Event]) -> bool:
        """Write memory and events; on failure keep them in the process, log, and say so.
        True when everything is on disk."""
        self.unsaved.extend(events)
        if len(self.unsaved) > UNSAVED_EVENTS_KEPT:
            lost = self.unsaved[:-UNSAVED_EVENTS_KEPT]
            self.unsaved = self.unsaved[-UNSAVED_EVENTS_KEPT:]
            self.dropped += len(lost)
            self.log.error(
                "events_dropped",
                count=len(lost),
                kinds=sorted({str(e.get("kind")) for e in lost}),
                reason="state dir not writable",
            )
        gap = [self._gap_event()] if self.error is not None else []
        # Under [ha] the owner's events go to etcd as well, whether or not the disk takes them.
        self.store.journal(self.cluster, events)
        try:
            self.store.save(self.cluster, memory)
            self.state.append_events(gap + self.unsaved, keep=EVENTS_KEPT)
        except OSError as exc:
            error = f"{self.state.path}: {exc.strerror or exc}"
            if self.error is None:
                self.failed_since = self.wall_clock()
            self.error = error
            self.log.error(
                "persist_failed",
                error=error,
                unsaved_events=len(self.unsaved),
                kinds=sorted({str(e.get("kind")) for e in events}),
            )
            return False
        if self.error is not None:
            self.log.warning("persist_recovered", was=self.error)
        self.unsaved = []
        self.dropped = 0
        self.error = None
        self.failed_since = None
        return True

    def _gap_event(self) -> Event:
        return self.event(
            "persist_gap",
            since=self.failed_since,
            error=self.error,
            dropped_events=self.dropped,
        )
