"""A `docker events` storm from one host: thousands of relevant events a second cost a bounded
number of wakes of the controller and of decoded lines (counted, never timed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

import pytest

from sparkd.runtime.controller import Controller
from sparkd.runtime.metrics import Metrics
from sparkd.runtime.state import StateDir
from sparkd.shell import events
from sparkd.shell.events import EventWatch
from sparkd.shell.ssh import SshPool
from tests.support.daemon import eventually
from tests.toy import reference_cluster

STORM = 10_000


def event(action: str, name: str) -> str:
    """One line as `docker events --format '{{json .}}'` prints it (docker/cli v29 events)."""
    return json.dumps(
        {"status": action, "id": "ab", "from": "img", "Type": "container", "Action": action,
         "Actor": {"ID": "ab", "Attributes": {"name": name}}, "scope": "local", "time": 1,
         "timeNano": 1},
        separators=(",", ":"),
    )  # fmt: skip


class StormyHost:
    """Plays a host's `docker events` streams: each connection prints its burst as fast as the
    reader takes it (thousands of events a second), then stays open and quiet."""

    def __init__(self, bursts: list[list[str]]) -> None:
        self.bursts = bursts
        self.connections = 0
        self.sent = 0
        self.closed = 0

    def connection(self, host: Any, ssh: Any) -> StormyHost:
        return self

    async def lines(self, command: str) -> AsyncGenerator[str, None]:
        self.connections += 1
        burst = self.bursts.pop(0) if self.bursts else []
        try:
            for index, line in enumerate(burst):
                self.sent += 1
                yield line
                if index % 100 == 0:
                    await asyncio.sleep(0)
            await asyncio.Event().wait()
        finally:
            self.closed += 1


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = events.parse_event

    def counting(line: str) -> events.ContainerEvent | None:
        seen.append(line)
        return real(line)

    monkeypatch.setattr(events, "parse_event", counting)
    return seen


async def test_a_storm_of_events_wakes_the_controller_a_bounded_number_of_times(
    decoded: list[str],
) -> None:
    cluster = reference_cluster()
    worker = "sparkd-sparks-ray-worker"
    storm = [event("die" if i % 2 else "start", worker) for i in range(STORM)]
    later = [event("die", worker)]
    host = StormyHost([storm, later])
    wakes: list[tuple[str, str]] = []
    watch = EventWatch(
        cluster.model_copy(update={"hosts": cluster.hosts[:1]}),
        cast(SshPool, host),
        lambda name, why: wakes.append((name, why)),
        retry_initial=0.05,
    )
    watch.start()
    try:
        # The storm read to its end, or dropped part-read and the stream set up again.
        await eventually(lambda: host.sent == STORM or host.connections == 2, 30)
        await asyncio.sleep(0.5)
        # The first event woke at once, the rest of the window (the storm, the later event) is
        # one wake at its end, and nothing after.
        await asyncio.sleep(2 * getattr(events, "COALESCE_WINDOW", 1.0))
    finally:
        await watch.stop()
    assert len(wakes) == 2, wakes[:5]
    assert host.closed == 2  # the stormy stream was closed, not left running
    # Lines past STORM_LINES in a window are not even read, let alone decoded.
    assert host.sent <= events.STORM_LINES + 2
    assert len(decoded) <= events.STORM_LINES + 1
    counts = watch.counts[cluster.hosts[0].name]
    assert counts.storms == 1
    assert counts.coalesced >= events.STORM_LINES - 2


def test_coalesced_lines_and_storms_are_exported_per_host(tmp_path: Path) -> None:
    cluster = reference_cluster()
    controller = Controller(cluster, SshPool(), StateDir(tmp_path))
    metrics = Metrics(lambda: [controller])

    def sample(name: str, host: str) -> float | None:
        labels = {"cluster": cluster.name, "host": host}
        return metrics.registry.get_sample_value(name, labels)

    assert sample("sparkd_docker_events_coalesced_total", "spark-a") == 0
    controller.event_counts["spark-a"] = events.HostEvents(coalesced=1999, storms=1)
    assert sample("sparkd_docker_events_coalesced_total", "spark-a") == 1999
    assert sample("sparkd_docker_event_storms_total", "spark-a") == 1
    assert sample("sparkd_docker_event_storms_total", "spark-b") == 0


def exec_event(action: str, name: str, exec_id: str) -> str:
    """An exec's line: docker/cli v29 puts the command in the action, the id in the attributes."""
    return json.dumps(
        {"status": action, "id": "ab", "from": "img", "Type": "container", "Action": action,
         "Actor": {"ID": "ab", "Attributes": {"name": name, "execID": exec_id}},
         "scope": "local", "time": 1, "timeNano": 1},
        separators=(",", ":"),
    )  # fmt: skip


class FedHost:
    """One open `docker events` stream that prints what the test feeds it, when it does."""

    def __init__(self) -> None:
        self.feed: asyncio.Queue[str] = asyncio.Queue()

    def connection(self, host: Any, ssh: Any) -> FedHost:
        return self

    async def lines(self, command: str) -> AsyncGenerator[str, None]:
        while True:
            yield await self.feed.get()


async def test_a_read_starting_while_a_wake_is_pending_does_not_wake_when_it_ends() -> None:
    """The window's events are coalesced, not skipped: the exec filter still learns that an
    exec is sparkd's own read, so its end is not taken for the serve's."""
    cluster = reference_cluster()
    head, worker = "sparkd-sparks-ray-head", "sparkd-sparks-ray-worker"
    host = FedHost()
    wakes: list[str] = []
    watch = EventWatch(
        cluster.model_copy(update={"hosts": cluster.hosts[:1]}),
        cast(SshPool, host),
        lambda name, why: wakes.append(why),
    )
    watch.start()
    try:
        for line in (
            event("start", head),
            event("die", worker),
            exec_event("exec_start: ray list nodes --format json", head, "e1"),
        ):
            host.feed.put_nowait(line)
        await eventually(lambda: len(wakes) == 2, 5)
        # The trailing wake names the window's last relevant event.
        assert wakes == [f"{head} start", f"{worker} die"]
        host.feed.put_nowait(exec_event("exec_die", head, "e1"))
        await eventually(lambda: host.feed.empty(), 5)
        await asyncio.sleep(2 * events.COALESCE_WINDOW)
        assert wakes == [f"{head} start", f"{worker} die"]
        # An exec never seen starting (the serve, launched before the stream) still wakes.
        host.feed.put_nowait(exec_event("exec_die", head, "e0"))
        await eventually(lambda: len(wakes) == 3, 5)
    finally:
        await watch.stop()
    assert wakes[2] == f"{head} exec_die"
