"""Event-driven detection: one `docker events` stream per host over its persistent connection.

A relevant event (one of sparkd's containers or a conflicting one dies or starts, the serve
process ends) or a dropped stream (a host going down) wakes the cluster's controller at once;
the interval cycle stays the safety net. Streams reconnect with backoff and are set up anew after
a reboot (the connection drops, the next attempt reconnects).
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
    if event.action not in catalogue.EVENT_ACTIONS:
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


@dataclass(eq=False)
class EventWatch:
    """Watches every host of a cluster; `wake(host, why)` is called for what matters."""

    cluster: ClusterSpec
    pool: SshPool
    wake: Wake
    _: KW_ONLY
    retry_initial: float = 1.0
    retry_max: float = 30.0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False, repr=False)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._watch(h)) for h in self.cluster.hosts]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, host: HostSpec) -> None:
        delay = self.retry_initial
        command = catalogue.docker_events(catalogue.EVENTS_SPAN).command
        while True:
            streamed = False
            execs = ExecFilter()
            try:
                conn = self.pool.connection(host, self.cluster.ssh)
                async for line in conn.lines(command):
                    streamed = True
                    delay = self.retry_initial
                    event = parse_event(line)
                    if event is not None and relevant(self.cluster, event) and execs.wakes(event):
                        self.wake(host.name, f"{event.name} {event.action}")
            except SshFailure as failure:
                if streamed:
                    # The stream ran and broke: the host may be going down; look now.
                    self.wake(host.name, f"event stream lost ({failure.kind})")
            await asyncio.sleep(delay)
            delay = min(self.retry_max, delay * 2)
