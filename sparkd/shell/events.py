"""Event-driven detection: one `docker events` stream per host over its persistent connection.

A relevant event (one of sparkd's containers or a conflicting one dies or starts, the serve
process ends) or a dropped stream (a host going down) wakes the cluster's controller at once;
the interval cycle stays the safety net. Streams reconnect with backoff and are set up anew after
a reboot (the connection drops, the next attempt reconnects).

A storm of events from one host (a container restarting in a loop, a host replaying its log)
costs a bounded number of looks: per host, a wake at most once per COALESCE_WINDOW (the relevant
events of the window after the first make one wake at its end, named by the last of them), and a
stream past STORM_LINES lines in one window is dropped and set up again after the backoff. Every
line up to that bound is decoded: the exec filter must see each `exec_start` of sparkd's own reads,
or their `exec_die` would wake the controller as if the serve had ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from sparkd.core.spec import container_prefix
from sparkd.core.text import printable_json
from sparkd.model.cluster import ClusterSpec
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue
from sparkd.shell.ssh import SshFailure, SshPool

Wake = Callable[[str, str], None]
SERVE = "vllm serve"
# One host wakes its controller at most once per window; what else comes in it is one more wake
# at its end. The controller rests after a wake anyway (runtime.next_look.wake_rest).
COALESCE_WINDOW = 1.0
# More lines in one window than a sane Docker daemon prints (every container of a host dying and
# starting at once is a few dozen, each `docker exec` of a look two): the stream is dropped.
STORM_LINES = 2000


@dataclass(frozen=True)
class ContainerEvent:
    action: str
    name: str
    # For `exec_start`/`exec_die`: the exec's id, and (on `exec_start`) its command.
    exec_id: str = ""
    command: str = ""


def parse_event(line: str) -> ContainerEvent | None:
    """One line of `docker events --format '{{json .}}'`; None when it is not one."""
    try:
        row = printable_json(json.loads(line))
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict):
        return None
    actor = row.get("Actor")
    attributes = actor.get("Attributes") if isinstance(actor, dict) else None
    name = attributes.get("name") if isinstance(attributes, dict) else None
    action = row.get("Action") or row.get("status")
    if not isinstance(name, str) or not isinstance(action, str):
        return None
    # Docker puts an exec's command in its action: `exec_start: ray status`.
    kind, _, command = action.partition(":")
    exec_id = attributes.get("execID") if isinstance(attributes, dict) else None
    return ContainerEvent(
        action=kind.strip(),
        name=name,
        exec_id=exec_id[:128] if isinstance(exec_id, str) else "",
        command=command.strip()[:512],
    )


def relevant(cluster: ClusterSpec, event: ContainerEvent) -> bool:
    if event.action not in catalogue.reads.EVENT_ACTIONS:
        return False
    if event.name.startswith(container_prefix(cluster)):
        return True
    return any(fnmatch.fnmatchcase(event.name, p) for p in cluster.cleanup.container_patterns)


class ExecFilter:
    """Tells the serve process's end from the end of sparkd's own `docker exec` reads (every
    cycle's `ray list nodes` ends in an `exec_die` too: waking on those would observe without
    end). An exec seen starting with another command is sparkd's or a human's read; an exec
    never seen starting (the serve launched before the stream) still wakes."""

    def __init__(self, keep: int = 512) -> None:
        self.keep = keep
        self._reads: dict[str, None] = {}

    def wakes(self, event: ContainerEvent) -> bool:
        if event.action == "exec_start":
            if event.exec_id and SERVE not in event.command:
                self._reads[event.exec_id] = None
                while len(self._reads) > self.keep:
                    del self._reads[next(iter(self._reads))]
            return False
        if event.action == "exec_die" and event.exec_id in self._reads:
            del self._reads[event.exec_id]
            return False
        return True


@dataclass
class HostEvents:
    """What one host's stream did to its cluster's controller: counted, for the metrics."""

    coalesced: int = 0
    storms: int = 0


class _Coalescer:
    """One host's wakes: the first of a window at once, the rest of it as one at its end, named
    by the last event that asked for it (what the look will find)."""

    def __init__(self, wake: Callable[[str], None], counts: HostEvents, window: float) -> None:
        self._wake = wake
        self._counts = counts
        self._window = window
        self._last: float | None = None
        self._trailing: asyncio.TimerHandle | None = None
        self._why = ""

    @property
    def pending(self) -> bool:
        return self._trailing is not None

    def event(self, why: str) -> None:
        now = asyncio.get_running_loop().time()
        if self._trailing is not None:
            self._counts.coalesced += 1
            self._why = why
            return
        if self._last is None or now - self._last >= self._window:
            self._fire(why)
            return
        self._counts.coalesced += 1
        self._why = why
        self._trailing = asyncio.get_running_loop().call_at(
            self._last + self._window, self._fire_trailing
        )

    def _fire_trailing(self) -> None:
        self._trailing = None
        self._fire(self._why)

    def _fire(self, why: str) -> None:
        self._last = asyncio.get_running_loop().time()
        self._wake(why)

    def close(self) -> None:
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None


@dataclass(eq=False)
class EventWatch:
    """Watches every host of a cluster; `wake(host, why)` is called for what matters."""

    cluster: ClusterSpec
    pool: SshPool
    wake: Wake
    _: KW_ONLY
    retry_initial: float = 1.0
    retry_max: float = 30.0
    window: float = COALESCE_WINDOW
    storm_lines: int = STORM_LINES
    # By host: kept by the caller across watches (the metrics' counters).
    counts: dict[str, HostEvents] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False, repr=False)

    def start(self) -> None:
        if not self._tasks:
            for host in self.cluster.hosts:
                self.counts.setdefault(host.name, HostEvents())
            self._tasks = [asyncio.create_task(self._watch(h)) for h in self.cluster.hosts]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, host: HostSpec) -> None:
        counts = self.counts.setdefault(host.name, HostEvents())
        wakes = _Coalescer(lambda why: self.wake(host.name, why), counts, self.window)
        try:
            await self._stream(host, wakes, counts)
        finally:
            wakes.close()

    async def _stream(self, host: HostSpec, wakes: _Coalescer, counts: HostEvents) -> None:
        delay = self.retry_initial
        command = catalogue.reads.docker_events(catalogue.reads.EVENTS_SPAN).command
        while True:
            streamed, stormed = await self._read(host, command, wakes, counts)
            if stormed:
                # Its events are too many to read: one look now, the stream again after the
                # backoff (doubling while the storm lasts); the interval cycle covers the rest.
                counts.storms += 1
                wakes.event(f"docker events storm (over {self.storm_lines} lines a window)")
            elif streamed:
                delay = self.retry_initial
            await asyncio.sleep(delay)
            delay = min(self.retry_max, delay * 2)

    async def _read(
        self, host: HostSpec, command: str, wakes: _Coalescer, counts: HostEvents
    ) -> tuple[bool, bool]:
        """One stream, to its end or to a storm: whether it streamed, whether it stormed."""
        loop = asyncio.get_running_loop()
        streamed = False
        execs = ExecFilter()
        window_start = loop.time()
        seen = 0
        try:
            conn = self.pool.connection(host, self.cluster.ssh)
            async with contextlib.aclosing(conn.lines(command)) as lines:
                async for line in lines:
                    streamed = True
                    now = loop.time()
                    if now - window_start >= self.window:
                        window_start, seen = now, 0
                    seen += 1
                    if seen > self.storm_lines:
                        return streamed, True
                    event = parse_event(line)
                    if event is not None and relevant(self.cluster, event) and execs.wakes(event):
                        wakes.event(f"{event.name} {event.action}")
        except SshFailure as failure:
            if streamed:
                # The stream ran and broke: the host may be going down; look now.
                wakes.event(f"event stream lost ({failure.kind})")
        return streamed, False
