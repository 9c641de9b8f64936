"""One instance's ownership and etcd store inside the test process, for the tiers that drive
the store directly (memory, intents, the event journal) rather than through a daemon."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sparkd.ha.ownership import Ownership
from sparkd.model.memory import Memory
from sparkd.runtime.ha_store import EtcdStore
from sparkd.runtime.persist import EVENTS_KEPT
from sparkd.runtime.state import StateDir
from tests.support.ha import Etcd, spec

# The elapsed time a box with a clock of its own always reads: its daemon time is this plus
# its offset, so two boxes can stand for two boots with different anchors.
MONOTONIC = 100.0


class Box:
    """Ownership of cluster c1 and the store over it; with `offset`, a daemon clock of its own
    (elapsed time fixed at MONOTONIC), else the machine's clocks."""

    def __init__(
        self,
        etcd: Etcd,
        name: str,
        tmp_path: Path,
        offset: float | None = None,
        kept: int = EVENTS_KEPT,
    ) -> None:
        self.name = name
        # How far this box's daemon time stands from its elapsed time, when it has its own.
        self.offset = 0.0 if offset is None else offset
        self.own_clock = offset is not None
        self.ha = Ownership(spec(etcd, name), ["c1"])
        self.refused: list[str] = []
        self.state = StateDir(tmp_path / f"state-{name}")
        self.store = EtcdStore(
            self.ha,
            self.state,
            on_refused=lambda cluster, detail: self.refused.append(detail),
            events_kept=kept,
            **({"monotonic": lambda: MONOTONIC} if self.own_clock else {}),
        )

    @property
    def now(self) -> float:
        return MONOTONIC + self.offset if self.own_clock else time.time()

    async def own(self, memory: Memory | None = None) -> None:
        """Owner of c1 after a round, continuing from `memory` (imported when etcd has none)."""
        await self.ha.round()
        assert self.ha.role("c1") == "owner"
        assert await self.store.adopt("c1", memory or Memory(), self.now) is not None


@asynccontextmanager
async def two_boxes(a: Box, b: Box) -> AsyncIterator[tuple[Box, Box]]:
    """Both boxes, their ownership stopped however the test ends."""
    try:
        yield a, b
    finally:
        await a.ha.stop()
        await b.ha.stop()
