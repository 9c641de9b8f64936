"""Maintenance windows: when one is open, and the scheduler that wakes controllers at its edges.

A window opens at each fire time of its cron (APScheduler's `CronTrigger`, in the configured or
the host's timezone) and lasts `duration`. Inside it the controller plans as if paused: it
observes, acts on nothing, and says why and until when.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger

from sparkd.model.cluster import ClusterSpec, MaintenanceSpec
from sparkd.model.memory import Memory, Pause
from sparkd.shell.cron import cron_trigger


@dataclass(frozen=True)
class Window:
    reason: str
    start: float
    end: float


def window_at(specs: Iterable[MaintenanceSpec], now: float) -> Window | None:
    """The window open at `now` (the one ending last when several overlap), or None."""
    found: Window | None = None
    for spec in specs:
        trigger = cron_trigger(spec)
        # The first start after now - duration: if it is not after now, it is still open.
        since = datetime.fromtimestamp(now - spec.duration, trigger.timezone)
        start = trigger.get_next_fire_time(None, since + timedelta(microseconds=1))
        if start is None or start.timestamp() > now:
            continue
        window = Window(spec.reason, start.timestamp(), start.timestamp() + spec.duration)
        if found is None or window.end > found.end:
            found = window
    return found


def overlay(memory: Memory, specs: Iterable[MaintenanceSpec], now: float) -> Memory:
    """Memory as the planner sees it: inside a maintenance window, paused by the window (an
    operator's own pause stays as it is). Never remembered: the window decides."""
    if memory.paused is not None and memory.paused.active(now):
        return memory
    window = window_at(specs, now)
    if window is None:
        return memory
    pause = Pause(
        reason=window.reason, by="maintenance window", since=window.start, until=window.end
    )
    return memory.evolve(paused=pause)


class MaintenanceScheduler:
    """Wakes a cluster's controller when one of its windows opens and when it closes."""

    def __init__(self, wake: Callable[[str], None]) -> None:
        self.wake = wake
        self.scheduler = AsyncIOScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60}
        )

    def start(self) -> None:
        self.scheduler.start()  # inside the running loop

    def schedule(self, cluster: ClusterSpec) -> None:
        self.unschedule(cluster.name)
        for index, spec in enumerate(cluster.maintenance):
            self.scheduler.add_job(
                self._opened,
                cron_trigger(spec),
                args=[cluster.name, spec.duration],
                id=f"maintenance:{cluster.name}:{index}",
                replace_existing=True,
            )

    def unschedule(self, cluster: str) -> None:
        for job in self.scheduler.get_jobs():
            if job.id.startswith(f"maintenance:{cluster}:"):
                job.remove()

    def next_opening(self, cluster: str) -> datetime | None:
        times = [
            job.next_run_time
            for job in self.scheduler.get_jobs()
            if job.id.startswith(f"maintenance:{cluster}:") and job.next_run_time is not None
        ]
        return min(times, default=None)

    async def _opened(self, cluster: str, duration: float) -> None:
        self.wake(cluster)
        closes = datetime.now().astimezone() + timedelta(seconds=duration)
        self.scheduler.add_job(self._closed, DateTrigger(run_date=closes), args=[cluster])

    async def _closed(self, cluster: str) -> None:
        self.wake(cluster)

    async def stop(self) -> None:
        self.scheduler.shutdown(wait=False)
        await asyncio.sleep(0)  # the shutdown runs on the next loop tick
