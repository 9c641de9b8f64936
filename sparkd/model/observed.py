"""One immutable snapshot of a cluster, taken once per cycle.

Unknown is explicit: a field that could not be observed is None with a reason elsewhere, a host
that could not be reached carries a classified `HostError`.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from sparkd.model.base import Value
from sparkd.model.probe import CheckResult, ProbeResult
from sparkd.model.weights import ModelFiles

HostErrorKind = Literal[
    "unreachable", "refused", "timeout", "auth", "host_key", "conn_lost", "exit_nonzero"
]
HOST_ERROR_KINDS: tuple[HostErrorKind, ...] = get_args(HostErrorKind)


class HostError(Value):
    kind: HostErrorKind
    detail: str = ""


class UnitState(Value):
    name: str
    load_state: str = "loaded"
    active_state: str = "inactive"
    sub_state: str = "dead"
    unit_file_state: str = ""

    @property
    def exists(self) -> bool:
        return self.load_state != "not-found"

    @property
    def active(self) -> bool:
        return self.active_state in ("active", "activating", "reloading", "deactivating")

    @property
    def enabled(self) -> bool:
        return self.unit_file_state in ("enabled", "enabled-runtime", "linked", "linked-runtime")


class Container(Value):
    name: str
    image: str
    state: str  # docker's State: created, running, paused, restarting, exited, dead
    labels: dict[str, str] = Field(default_factory=dict)
    started_at: float | None = None
    status: str = ""
    # The image ID (`sha256:...`) the container runs, where it was read (sparkd's own).
    image_id: str | None = None

    @property
    def running(self) -> bool:
        return self.state in ("running", "restarting", "paused")

    def label(self, key: str) -> str | None:
        return self.labels.get(key)


class GpuProcess(Value):
    pid: int
    name: str
    used_memory_mib: int | None = None
    # The container the process runs in (from `docker top`), None when it runs outside any.
    container: str | None = None
    # A container's process list could not be read, so this process may be that container's:
    # reported, never killed.
    owner_unknown: bool = False


class Interface(Value):
    name: str
    up: bool
    addresses: tuple[str, ...] = ()


KernelKind = Literal[
    "xid", "nv_no_memory", "aer_fatal", "mlx5_pci_error", "soft_lockup", "oom_kill"
]
KERNEL_KINDS: tuple[KernelKind, ...] = get_args(KernelKind)


class KernelEvent(Value):
    """One kind of kernel message (a flood of the same one is one event, counted)."""

    kind: KernelKind
    xid: int | None = None
    # The device the message names (`PCI:0000:01:00`, `0000:01:00.0`), or "".
    device: str = ""
    count: int = 1
    # The kernel's monotonic timestamps (seconds since boot) of the first and last line.
    first_at: float = 0.0
    last_at: float = 0.0
    # Every line's timestamp (the read is bounded, so these are too): what is new since a look.
    times: tuple[float, ...] = ()
    line: str = ""


class KernelLog(Value):
    """The tail of this boot's kernel log, as one bounded read returned it."""

    events: tuple[KernelEvent, ...] = ()
    lines: int = 0
    # The newest timestamp of any line read (seconds since boot), None when nothing was read.
    last_at: float | None = None


class Fabric(Value):
    """The data interface's link and its RDMA port, from sysfs (None: not read or absent)."""

    mtu: int | None = None
    carrier_changes: int | None = None
    rdma_device: str | None = None
    port: int | None = None
    # The port's `state` and `phys_state` words: ACTIVE / LinkUp when sound.
    port_state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    # The GID table row holding the data IP as RoCE v2 (what NCCL_IB_GID_INDEX must name).
    gid_index: int | None = None


class CacheEntry(Value):
    """One entry of `model.cache_root` on a host: its name, and its modification time by the
    host's own clock (only ever compared with the same host's other entries)."""

    name: str
    mtime: float


class HostFacts(Value):
    name: str
    error: HostError | None = None
    boot_id: str | None = None
    units: tuple[UnitState, ...] = ()
    containers: tuple[Container, ...] = ()
    gpu_processes: tuple[GpuProcess, ...] = ()
    interface: Interface | None = None
    disk_free_bytes: int | None = None
    # Free bytes on Docker's data root (/var/lib/docker), where containers write.
    docker_disk_free_bytes: int | None = None
    # Local images; None when not observed (the planner then assumes nothing about them).
    images: tuple[str, ...] | None = None
    # The ID the configured image tag points at on this host (`docker image inspect`).
    image_id: str | None = None
    # A read that failed is unknown, never empty: why the units or GPU processes are unknown.
    units_error: str | None = None
    gpu_error: str | None = None
    # The data-plane interface could not be read (renamed or gone after a kernel update:
    # `Device "..." does not exist.`): its link is unknown, never healthy.
    interface_error: str | None = None
    # Docker did not answer (daemon down, or hung until the tool timeout) while the host did:
    # its containers, their processes and what runs in them are unknown, never "none".
    docker_error: str | None = None
    # This boot's kernel log tail (None when unread: `kernel_error` says why).
    kernel: KernelLog | None = None
    kernel_error: str | None = None
    # `MemAvailable` of /proc/meminfo: on GB10 GPU allocations come out of it (unified memory).
    memory_available_bytes: int | None = None
    memory_total_bytes: int | None = None
    fabric: Fabric | None = None
    # `model.cache_root`: its entries (None when unread or missing) and its file system's free
    # bytes (`df`, in the same call as log_dir's).
    cache_entries: tuple[CacheEntry, ...] | None = None
    cache_free_bytes: int | None = None
    # The head's model directory, read only while a rollout prepares (core.weights).
    model_files: ModelFiles | None = None

    @property
    def reachable(self) -> bool:
        return self.error is None

    @property
    def docker_up(self) -> bool:
        return self.error is None and self.docker_error is None

    def link_problem(self, ip: str) -> str | None:
        """Why the data link cannot carry Ray, or None when it can (or was not observed)."""
        iface = self.interface
        if iface is None:
            if self.interface_error is not None:
                return f"waiting for data link: its state is unknown ({self.interface_error})"
            return None
        if not iface.up:
            return f"waiting for data link on {iface.name or 'its interface'} (down)"
        if ip not in iface.addresses:
            return f"waiting for data link on {iface.name} (no address {ip} yet)"
        return None

    def container(self, name: str) -> Container | None:
        return next((c for c in self.containers if c.name == name), None)

    def unit(self, name: str) -> UnitState | None:
        return next((u for u in self.units if u.name == name), None)


class RayNode(Value):
    node_id: str
    ip: str
    alive: bool
    gpus: float = 0.0
    is_head: bool = False
    state_message: str | None = None


class RayState(Value):
    """Ray as the head sees it. `error` set means Ray did not answer (no cluster, or down)."""

    nodes: tuple[RayNode, ...] = ()
    gpus_total: float = 0.0
    error: str | None = None
    # `ray status` names nodes but not their IPs; `ray list nodes` gives both.
    ips_known: bool = True
    # The GPUs `ray status` counts, when it was read beside the node list: a node is listed
    # ALIVE a few seconds before its GPU can be placed on.
    gpus_usable: float | None = None
    # The previous cycle's reading, not read again: the cluster was converged and nothing since
    # (no event, no probe due) said Ray changed, so the head was spared a `ray` call.
    reused: bool = False

    @property
    def up(self) -> bool:
        return self.error is None

    @property
    def alive_ips(self) -> frozenset[str]:
        return frozenset(n.ip for n in self.nodes if n.alive)

    @property
    def alive_node_ids(self) -> tuple[str, ...]:
        return tuple(sorted(n.node_id for n in self.nodes if n.alive))


LoadStage = Literal["starting", "weights", "graph_capture", "ready", "failed"]


class LoadProgress(Value):
    stage: LoadStage
    percent: float | None = None
    # When the log last showed progress (epoch seconds, host clock).
    progress_at: float | None = None
    message: str = ""


class ServeState(Value):
    """The `vllm serve` process in the head container."""

    running: bool
    pid: int | None = None
    elapsed_seconds: float | None = None
    spec_hash: str | None = None
    progress: LoadProgress | None = None
    log_tail: tuple[str, ...] = ()
    # CPU seconds used so far by the serve process and the engine processes beside it: a
    # silent load stage (CUDA-graph capture, torch.compile) still burns CPU, a hang does not.
    cpu_seconds: float | None = None
    # With no serve process: vLLM engine processes left in the head container (an API server
    # killed by SIGKILL leaves its EngineCore and workers running, holding the GPUs).
    orphans: tuple[str, ...] = ()


# `http_error`: the server answers, but refuses sparkd (a 401 from /v1/models: a wrong key).
EndpointStatus = Literal["up", "http_error", "refused", "timeout", "error", "not_run"]


class ModelEndpoint(Value):
    status: EndpointStatus
    health_status: int | None = None
    models: tuple[str, ...] = ()
    requests_running: float | None = None
    requests_waiting: float | None = None
    generation_tokens_total: float | None = None
    detail: str = ""

    def serves(self, model_id: str) -> bool:
        return self.status == "up" and self.health_status == 200 and model_id in self.models


class Observed(Value):
    cluster: str
    observed_at: float
    hosts: tuple[HostFacts, ...]
    ray: RayState | None = None
    serve: ServeState | None = None
    endpoint: ModelEndpoint | None = None
    probe: ProbeResult | None = None
    # The API key file's fingerprint as read this cycle (core.spec.key_fingerprint), never the
    # key; None when no key file is configured or it could not be read.
    api_key_fingerprint: str | None = None
    # A rollout's acceptance checks, when this cycle ran them (core.rollout.checks_due).
    checks: tuple[CheckResult, ...] | None = None

    def host(self, name: str) -> HostFacts | None:
        return next((h for h in self.hosts if h.name == name), None)
