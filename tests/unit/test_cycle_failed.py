"""A cycle that fails keeps the controller alive for the watchdog: the loop goes on, and that
is progress from when the failure has been written down, however long writing it took."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from sparkd.model.plan import Plan
from tests.toy import Toy


class SlowLog:
    """A log whose traceback takes `seconds` of the clock to write, as on a starved machine."""

    def __init__(self, clock: list[float], seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.failures = 0

    def exception(self, event: str, **_: Any) -> None:
        self.failures += 1
        self.clock[0] += self.seconds

    def debug(self, event: str, **_: Any) -> None:
        pass


def test_a_failed_cycle_whose_traceback_took_long_is_still_progress(tmp_path: Path) -> None:
    toy = Toy.healthy()
    clock = [1000.0]
    controller = toy.controller(tmp_path, clock)
    # Longer than the watchdog's three intervals: only a stamp after the write can be fresh.
    log = SlowLog(clock, 4 * toy.cluster.interval)
    controller.log = cast(Any, log)

    async def failing() -> Plan:
        controller.stopping = True  # this one cycle
        raise RuntimeError("a look that failed")

    controller.cycle = failing  # type: ignore[method-assign]
    asyncio.run(controller._loop())
    assert log.failures == 1
    assert controller.healthy(clock[0]) == (True, "ok")
    assert controller.view.last_error == "RuntimeError: a look that failed"
