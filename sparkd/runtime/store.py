"""Where a controller's memory is kept: the state dir (the default), or etcd under `[ha]`.

The controller writes memory as each action starts and finishes (`save`); before a mutating
command is sent, `ready` must have made the intended attempt durable (on disk it already is;
in etcd it is written with the intent record, guarded by the owner's token); `settled` says
the action's outcome is known (the intent goes with the next write); `adopt`, before each look
of an owner, brings the store's memory in when this instance has just become the owner, and
`continued`, once that memory is the controller's, applies what operators asked meanwhile.
`journal` takes the events persisted with the memory: the state dir's journal has them already
(runtime.persist); under `[ha]` the owner's go to etcd's too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sparkd.model.memory import Memory
from sparkd.model.plan import Action
from sparkd.runtime.state import MemoryRead, StateDir


class EventsUnreadable(Exception):
    """The journal a cluster's events are read from did not answer (etcd, under [ha])."""


@dataclass(frozen=True)
class Adopted:
    """The memory a new owner continues from, and the former owner's action whose outcome is
    unknown (its intent record, when one was left)."""

    memory: Memory
    source: str
    intent: dict[str, Any] | None = None


class MemoryStore(Protocol):
    def read(self, cluster: str, now: float) -> MemoryRead: ...

    def save(self, cluster: str, memory: Memory) -> None: ...

    def journal(self, cluster: str, events: list[dict[str, Any]]) -> None: ...

    async def adopt(self, cluster: str, memory: Memory, now: float) -> Adopted | None: ...

    async def continued(self, cluster: str) -> None: ...

    async def ready(self, cluster: str, action: Action) -> str | None: ...

    def settled(self, cluster: str) -> None: ...


class LocalStore:
    """The state dir: every save is on disk when it returns, and there is only one owner."""

    def __init__(self, state: StateDir) -> None:
        self.state = state

    def read(self, cluster: str, now: float) -> MemoryRead:
        return self.state.read_memory(cluster, now)

    def save(self, cluster: str, memory: Memory) -> None:
        self.state.save_memory(cluster, memory)

    def journal(self, cluster: str, events: list[dict[str, Any]]) -> None:
        return None

    async def adopt(self, cluster: str, memory: Memory, now: float) -> Adopted | None:
        return None

    async def continued(self, cluster: str) -> None:
        return None

    async def ready(self, cluster: str, action: Action) -> str | None:
        return None

    def settled(self, cluster: str) -> None:
        return None
