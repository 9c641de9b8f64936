"""The daemon's clocks (the model is in sparkd.core.clock): daemon time, which cannot step, and
the wall clock, which can. One per controller; the anchor survives a restart in the same boot."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import structlog

from sparkd.core.clock import STEP_NOTICED, stepped
from sparkd.model.memory import ClockAnchor

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def elapsed() -> float:
    """Seconds since boot, suspend included (a suspended ops box has let time pass)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        return time.clock_gettime(boottime)
    return time.monotonic()


def ops_boot_id() -> str:
    """What tells this boot of the ops box from the last: the kernel's boot id, or under the
    unit (ProcSubset=pid hides /proc/sys) a marker in the runtime directory, a tmpfs that a
    reboot empties. "" when neither can be had: the anchor is then never carried over."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        pass
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if not runtime:
        return ""
    marker = Path(runtime) / "boot-marker"
    try:
        return marker.read_text().strip()
    except FileNotFoundError:
        token = f"marker-{uuid.uuid4()}"
        try:
            marker.write_text(token)
        except OSError:
            return ""
        return token
    except OSError:
        return ""


class DaemonClock:
    def __init__(
        self,
        wall_clock: Callable[[], float],
        monotonic: Callable[[], float],
        boot_id: str,
        remembered: ClockAnchor | None = None,
    ) -> None:
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        mono = monotonic()
        if (
            remembered is not None
            and boot_id
            and remembered.boot_id == boot_id
            and mono >= remembered.mono_at
        ):
            self.anchor = remembered
            self.carried = True
        else:
            self.anchor = ClockAnchor(boot_id=boot_id, offset=wall_clock() - mono, mono_at=mono)
            self.carried = False

    def now(self) -> float:
        """Daemon time: what every duration is measured on."""
        return self.monotonic() + self.anchor.offset

    def step(self) -> float:
        """How far the wall clock moved against daemon time (positive: forward)."""
        return stepped(self.anchor.offset, self.wall_clock(), self.monotonic())

    def noticed(self) -> float | None:
        """The step, when it is large enough to be one (not a slew); else None."""
        step = self.step()
        return step if abs(step) >= STEP_NOTICED else None

    def wall_of(self, at: float) -> float:
        """A daemon-time stamp as wall clock, for people (events, status, metrics)."""
        return at + self.step()


def note_step(
    step: float | None, was: float | None, log: structlog.stdlib.BoundLogger
) -> float | None:
    """Log a wall-clock step once, when it first shows or changes; the step to show (`was`: the
    one shown). Nothing is decided on it: durations are daemon time, a pause's end is wall
    clock."""
    if abs((step or 0.0) - (was or 0.0)) < STEP_NOTICED:
        return was
    if step is None:
        log.info("clock_step_gone", was=round(was or 0.0, 3))
    else:
        log.warning(
            "clock_step",
            seconds=round(step, 3),
            note="durations run on the monotonic clock; pauses and windows on the wall",
        )
    return step
