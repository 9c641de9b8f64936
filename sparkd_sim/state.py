"""Plain mutable state of the simulated hosts: units, containers, processes, GPUs, Ray nodes.

Everything here is data; the behaviour that changes it lives in the world (`world.py` and its
parts) and the fake tools.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from sparkd_sim.fake_fabric import Link

if TYPE_CHECKING:
    from sparkd_sim.timing import Timing

RestartPolicy = Literal["no", "always", "unless-stopped", "on-failure"]
ContainerStatus = Literal["created", "running", "restarting", "exited"]


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
    """A process the world pretends is running (it has a simulated PID, no real process).

    It accrues CPU time at `cores` (how busy it is now) times `cpu_scale` CPU seconds per wall
    second: `Timing.cpu_scale` makes a fast world's processes gain as much CPU time per recheck
    interval as real ones do per real recheck interval."""

    pid: int
    args: str
    started: float = field(default_factory=time.monotonic)
    user: str = "root"
    ppid: int = 1
    cores: float = 0.0
    cpu_scale: float = 1.0
    _cpu_base: float = 0.0
    _cpu_since: float = field(default_factory=time.monotonic)

    def cpu_seconds(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        return self._cpu_base + self.cores * self.cpu_scale * max(0.0, now - self._cpu_since)

    def busy(self, cores: float) -> None:
        """From now on it uses `cores` CPUs."""
        now = time.monotonic()
        self._cpu_base = self.cpu_seconds(now)
        self._cpu_since = now
        self.cores = cores


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
    restart_delay: float = 0.0
    """Docker's current restart backoff for this container (0: none yet)."""
    restart_task: asyncio.Task[None] | None = None
    crash_loop: bool = False
    """Its main process exits with an error shortly after every start."""
    image_id: str = ""
    """The image ID its tag pointed at when it was created (a later re-pull does not change it)."""
    exec_ids: list[str] = field(default_factory=list)
    """The `docker exec` instances running in it (`docker inspect`'s ExecIDs)."""
    layer_bytes: int = 0
    """What its writable layer holds: what the daemon walks to tell its size (`docker ps -s`)."""

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def restarting(self) -> bool:
        return self.status == "restarting"

    @property
    def up(self) -> bool:
        """What docker counts as running (`docker ps` without `-a`, `State.Running`)."""
        return self.status in ("running", "restarting")

    def log(self, line: str) -> None:
        self.logs.append(line)
        # A container's log is bounded like a log driver with rotation.
        if len(self.logs) > 5000:
            del self.logs[:1000]


DeathKind = Literal["killed", "hung", "stopped"]
"""How a Ray node stopped answering: its raylet died (container killed, host rebooted), it hung
(processes stopped, a host that stops answering without RST), or `ray stop` ended it."""
NodeState = Literal["ALIVE", "DEAD"]

_STATE_MESSAGES: dict[DeathKind, str] = {
    "killed": "Unexpected termination: health check failed due to missing too many heartbeats",
    "hung": "Unexpected termination: health check failed due to missing too many heartbeats",
    "stopped": "Expected termination: received SIGTERM",
}


def _delays(timing: Timing, kind: DeathKind) -> tuple[float, float, float]:
    """(DEAD in list nodes, gone from `Active:`, GPU gone from the total) after a death."""
    if kind == "hung":
        return timing.hung_listed, timing.hung_inactive, timing.hung_uncounted
    if kind == "stopped":
        return timing.stop_listed, timing.stop_inactive, timing.stop_uncounted
    return timing.dead_listed, timing.dead_inactive, timing.dead_uncounted


@dataclass
class RayNode:
    """One registration of a raylet with a head: a restarted raylet is a new node (new id)."""

    node_id: str
    ip: str
    host: str
    container_id: str
    is_head: bool
    gpus: float = 1.0
    cpus: float = 20.0
    memory_gib: float = 109.77
    object_store_gib: float = 9.73
    launched: float = field(default_factory=time.monotonic)
    listed_after: float = 0.0
    """Launch -> ALIVE in `ray list nodes`."""
    counted_after: float = 0.0
    """Launch -> in `ray status` (`Active:` and the GPU total)."""
    deaths: list[tuple[float, DeathKind]] = field(default_factory=list)
    """When and how it stopped answering (a hung node that is later killed has both)."""
    raylet_exit: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the node's raylet ends on its own (then `ray start --block` exits 1)."""
    stopped: bool = False
    """Ended by `ray stop`: `ray start --block` keeps running with no Ray in it."""
    lost: bool = False
    """What used the node (a model's Ray workers) has been told it is gone."""

    @property
    def runs(self) -> bool:
        """Its raylet still exists (possibly frozen)."""
        return (
            not self.stopped
            and not self.raylet_exit.is_set()
            and not any(kind == "killed" for _, kind in self.deaths)
        )

    @property
    def died_at(self) -> float | None:
        return min((at for at, _ in self.deaths), default=None)

    @property
    def hung(self) -> bool:
        return any(kind == "hung" for _, kind in self.deaths)

    def _after(self, now: float, timing: Timing, which: int) -> tuple[bool, DeathKind | None]:
        """Whether the head has noticed the death for view `which` (0 list, 1 active, 2 GPU)."""
        for at, kind in sorted(self.deaths):
            if now >= at + _delays(timing, kind)[which]:
                return True, kind
        return False, None

    def _registered(self, delay: float) -> float | None:
        """When the node shows up in a view, or None if it died before that."""
        shows = self.launched + delay
        died = self.died_at
        if died is not None and died < shows:
            return None
        return shows

    def listed(
        self, state: str, message: str | None, resources: dict[str, object]
    ) -> dict[str, object]:
        """Its row in Ray's state API, the CLI's `ray list nodes` and the dashboard's alike;
        only how each gives `resources` differs."""
        return {
            "node_id": self.node_id,
            "node_ip": self.ip,
            "is_head_node": self.is_head,
            "state": state,
            "state_message": message,
            "node_name": self.ip,
            "resources_total": resources,
            "labels": {"ray.io/node-id": self.node_id},
        }

    def state(self, now: float, timing: Timing) -> NodeState | None:
        """ALIVE/DEAD in `ray list nodes`, or None while not (or never) registered."""
        shows = self._registered(self.listed_after)
        if shows is None or now < shows:
            return None
        noticed, _ = self._after(now, timing, 0)
        return "DEAD" if noticed else "ALIVE"

    def state_message(self, now: float, timing: Timing) -> str | None:
        noticed, kind = self._after(now, timing, 0)
        return _STATE_MESSAGES[kind] if noticed and kind is not None else None

    def active(self, now: float, timing: Timing) -> bool:
        """Listed under `Active:` in `ray status`."""
        shows = self._registered(self.counted_after)
        return shows is not None and now >= shows and not self._after(now, timing, 1)[0]

    def counted(self, now: float, timing: Timing) -> bool:
        """Its resources count in `ray status` `Total Usage:` (and for placement)."""
        shows = self._registered(self.counted_after)
        return shows is not None and now >= shows and not self._after(now, timing, 2)[0]


@dataclass
class RayCluster:
    head_container_id: str
    head_host: str
    ip: str
    port: int
    dashboard: bool
    launched: float = field(default_factory=time.monotonic)
    answers_after: float = 0.0
    """Launch -> the CLI reaches the head at all."""
    nodes: list[RayNode] = field(default_factory=list)
    alive: bool = True
    gpus_in_use: float = 0.0
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the head goes away; its workers give up (see `Timing.gcs_reconnect_timeout`)."""
    ended_at: float | None = None
    dashboard_port: int = 8265
    auth_token: str | None = None
    """With `RAY_AUTH_MODE=token` in the head's env: the token its dashboard accepts."""
    autoscaler_v2: bool = False
    """Started with `RAY_enable_autoscaler_v2=1`: no report in the dashboard's KV-backed
    `/api/cluster_status`, nodes with nothing scheduled under `ray status`'s `Idle:`."""

    def answers(self, now: float) -> bool:
        return self.alive and now >= self.launched + self.answers_after

    def up_since(self) -> float:
        return self.launched + self.answers_after

    def counted_nodes(self, now: float, timing: Timing) -> list[RayNode]:
        return [n for n in self.nodes if n.counted(now, timing)]

    def total_gpus(self, now: float, timing: Timing) -> float:
        return sum(n.gpus for n in self.counted_nodes(now, timing))


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
    rayless_ids: set[str] = field(default_factory=set)
    """Image IDs with no `ray` in them (NGC's vLLM image from 26.05): `ray start` in a container
    of one exits 127 at once."""
    image_ids: dict[str, str] = field(default_factory=dict)
    """Tags whose image ID differs from the one every host shares (re-pulled, retagged)."""
    units: dict[str, Unit] = field(default_factory=dict)
    containers: dict[str, Container] = field(default_factory=dict)
    gpu_processes: list[GpuProcess] = field(default_factory=list)
    disk_avail_bytes: int = 1_536_000_000_000
    # The GPU fell off the bus (Xid 79): nvidia-smi exits 15 until the host reboots.
    gpu_lost: bool = False
    disk_total_bytes: int = 3_841_000_000_000
    ray_ip_override: str | None = None
    gpu_uuid: str = field(default_factory=lambda: "GPU-" + new_boot_id())
    # This boot's kernel log (seconds since boot, message) and MemAvailable (sim.fake_kernel).
    kernel_log: list[tuple[float, str]] = field(default_factory=list)
    memory_available_kib: int = 104_283_952
    # The data link's sysfs (sim.fake_fabric.Link).
    link: Link = field(default_factory=Link)

    def container(self, ref: str) -> Container | None:
        """Look a container up by name, full id or unique id prefix, as docker does."""
        for c in self.containers.values():
            if c.name == ref.lstrip("/") or c.id == ref:
                return c
        matches = [c for c in self.containers.values() if ref and c.id.startswith(ref)]
        return matches[0] if len(matches) == 1 else None
