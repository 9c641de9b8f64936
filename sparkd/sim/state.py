"""Plain mutable state of the simulated hosts: units, containers, processes, GPUs, Ray nodes.

Everything here is data; the behaviour that changes it lives in `world.py` and the fake tools.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

RestartPolicy = Literal["no", "always", "unless-stopped", "on-failure"]
ContainerStatus = Literal["created", "running", "exited"]


def new_container_id() -> str:
    return secrets.token_hex(32)


def new_node_id() -> str:
    return secrets.token_hex(28)


def new_boot_id() -> str:
    raw = secrets.token_hex(16)
    return f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"


@dataclass
class Unit:
    name: str
    enabled: bool
    active: bool
    description: str = ""


@dataclass
class SimProcess:
    """A process the world pretends is running (it has a simulated PID, no real process)."""

    pid: int
    args: str
    started: float = field(default_factory=time.monotonic)
    user: str = "root"
    ppid: int = 1


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_mib: int
    graphics: bool = False
    container_id: str | None = None


@dataclass
class Mount:
    source: str
    destination: str
    read_only: bool = False


@dataclass
class Container:
    id: str
    name: str
    image: str
    command: list[str]
    labels: dict[str, str]
    env: dict[str, str]
    mounts: list[Mount]
    restart: RestartPolicy
    network: str = "host"
    shm_size: str = ""
    gpus: str = ""
    created_wall: float = field(default_factory=time.time)
    status: ContainerStatus = "created"
    exit_code: int = 0
    oom_killed: bool = False
    started_wall: float = 0.0
    finished_wall: float = 0.0
    stopped_by_user: bool = False
    restart_count: int = 0
    logs: list[str] = field(default_factory=list)
    processes: list[SimProcess] = field(default_factory=list)
    real_pids: set[int] = field(default_factory=set)
    main_task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"

    def log(self, line: str) -> None:
        self.logs.append(line)
        # A container's log is bounded like a log driver with rotation.
        if len(self.logs) > 5000:
            del self.logs[:1000]


@dataclass
class RayNode:
    node_id: str
    ip: str
    host: str
    container_id: str
    is_head: bool
    gpus: float = 1.0
    cpus: float = 20.0
    memory_gib: float = 109.77
    object_store_gib: float = 9.73
    died_at: float | None = None

    def counted(self, now: float, heartbeat_timeout: float) -> bool:
        """Ray keeps counting a dead node until its heartbeats have been missed long enough."""
        return self.died_at is None or now - self.died_at < heartbeat_timeout

    def dead(self, now: float, heartbeat_timeout: float) -> bool:
        return not self.counted(now, heartbeat_timeout)


@dataclass
class RayCluster:
    head_container_id: str
    head_host: str
    ip: str
    port: int
    dashboard: bool
    nodes: list[RayNode] = field(default_factory=list)
    alive: bool = True
    gpus_in_use: float = 0.0
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the head goes away; its workers give up after the GCS reconnect timeout."""

    def counted_nodes(self, now: float, heartbeat_timeout: float) -> list[RayNode]:
        return [n for n in self.nodes if n.counted(now, heartbeat_timeout)]

    def total_gpus(self, now: float, heartbeat_timeout: float) -> float:
        return sum(n.gpus for n in self.counted_nodes(now, heartbeat_timeout))


@dataclass
class HostState:
    name: str
    address: str
    role: Literal["head", "worker"]
    data_ip: str
    interface: str
    log_dir: str
    home: str
    boot_id: str = field(default_factory=new_boot_id)
    booted_wall: float = field(default_factory=time.time)
    images: set[str] = field(default_factory=set)
    units: dict[str, Unit] = field(default_factory=dict)
    containers: dict[str, Container] = field(default_factory=dict)
    gpu_processes: list[GpuProcess] = field(default_factory=list)
    disk_avail_bytes: int = 1_536_000_000_000
    disk_total_bytes: int = 3_841_000_000_000
    ray_ip_override: str | None = None
    gpu_uuid: str = field(default_factory=lambda: "GPU-" + new_boot_id())

    def container(self, ref: str) -> Container | None:
        """Look a container up by name, full id or unique id prefix, as docker does."""
        for c in self.containers.values():
            if c.name == ref.lstrip("/") or c.id == ref:
                return c
        matches = [c for c in self.containers.values() if ref and c.id.startswith(ref)]
        return matches[0] if len(matches) == 1 else None
