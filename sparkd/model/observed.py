"""A cycle's reading of a cluster (every host's reading, and what the head showed), taken once
per cycle; saved with the memory it is a snapshot (sparkd.model.snapshot).

Unknown is explicit: a field that could not be observed is None with a reason elsewhere, a host
that could not be reached carries a classified `HostError`. Each field's meaning is its
`description`: docs/snapshot.md's tables are generated from them (`python -m tests.snapshot_doc`).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from sparkd.model.base import Value
from sparkd.model.probe import CheckResult, ProbeResult
from sparkd.model.weights import ModelFiles

HostErrorKind = Literal[
    "unreachable", "refused", "timeout", "auth", "host_key", "conn_lost", "exit_nonzero"
]
HOST_ERROR_KINDS: tuple[HostErrorKind, ...] = get_args(HostErrorKind)
# SSH failures that are silence: the host may be wedged. Any other (auth, host_key, a refused
# connection, a command that exited non-zero) is the host answering.
SILENT_ERRORS: frozenset[HostErrorKind] = frozenset({"unreachable", "timeout", "conn_lost"})
# SSH answers that refuse sparkd: the host is up, and what fails is sparkd's access to it.
REFUSALS: frozenset[HostErrorKind] = frozenset({"auth", "host_key", "refused", "exit_nonzero"})


class HostError(Value):
    kind: HostErrorKind = Field(description="how the SSH session failed")
    detail: str = Field("", description="what the failure said")


class UnitState(Value):
    """A configured cleanup unit, as `systemctl show` prints it."""

    name: str = Field(description="the unit's name")
    load_state: str = Field("loaded", description="`LoadState`: `not-found` when there is none")
    active_state: str = Field("inactive", description="`ActiveState`")
    sub_state: str = Field("dead", description="`SubState`")
    unit_file_state: str = Field("", description="`UnitFileState` (`enabled`, `disabled`, ...)")

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
    name: str = Field(description="the container's name")
    image: str = Field(description="the image it was created from, as named")
    state: str = Field(
        description="Docker's `State`: `created`, `running`, `paused`, `restarting`, `exited` "
        "or `dead`"
    )
    labels: dict[str, str] = Field(default_factory=dict, description="its labels")
    started_at: float | None = Field(None, description="when it started (its host's report)")
    status: str = Field("", description="Docker's `Status` line (`Up 2 hours`, `Exited (137) ...`)")
    image_id: str | None = Field(
        None, description="the image ID (`sha256:...`) it runs, where it was read (sparkd's own)"
    )
    exit_code: int | None = Field(
        None, description="the exit code of an exited container (from `Status`), else null"
    )
    last_line: str | None = Field(
        None,
        description="the last line sparkd's own exited container printed (`docker logs "
        "--tail`), bounded, secrets redacted; null when not read",
    )

    @property
    def running(self) -> bool:
        return self.state in ("running", "restarting", "paused")

    def label(self, key: str) -> str | None:
        return self.labels.get(key)


class GpuProcess(Value):
    pid: int = Field(description="its PID on the host")
    name: str = Field(description="its process name, as nvidia-smi prints it")
    used_memory_mib: int | None = Field(None, description="the GPU memory it holds, MiB")
    container: str | None = Field(
        None,
        description="the container it runs in (from `docker top`), null for a process outside any",
    )
    owner_unknown: bool = Field(
        False,
        description="a container's process list could not be read, so it may be that "
        "container's: reported, never killed",
    )


class Interface(Value):
    """The data-plane interface, as `ip` shows it."""

    name: str = Field(description="its name")
    up: bool = Field(description="whether its link is up")
    addresses: tuple[str, ...] = Field((), description="its IP addresses")


KernelKind = Literal[
    "xid",
    "nv_no_memory",
    "aer_fatal",
    "mlx5_pci_error",
    "soft_lockup",
    "oom_kill",
    # The driver says the GPU needs a reset: XID 154 to a reset or reboot, or its rate-limited
    # GSP RPC errors. On GB10, a reboot.
    "gpu_reset_required",
]
KERNEL_KINDS: tuple[KernelKind, ...] = get_args(KernelKind)


class KernelEvent(Value):
    """One kind of kernel message (a flood of the same one is one event, counted)."""

    kind: KernelKind = Field(description="what the message says")
    xid: int | None = Field(None, description="the NVIDIA XID, for `xid`")
    device: str = Field(
        "", description='the device it names (`PCI:0000:01:00`, `0000:01:00.0`), or ""'
    )
    count: int = Field(1, description="how many lines it stands for (a flood is one event)")
    first_at: float = Field(0.0, description="the first line's time (seconds since boot)")
    last_at: float = Field(0.0, description="the last line's time (seconds since boot)")
    times: tuple[float, ...] = Field(
        (),
        description="every line's time (the read is bounded, so these are too): what is new "
        "since a look",
    )
    line: str = Field("", description="the last line, as the kernel printed it")


class KernelLog(Value):
    """The tail of this boot's kernel log, as one bounded read returned it."""

    events: tuple[KernelEvent, ...] = Field(
        (), description="one per kind, XID and device (`journalctl -k -b -o short-monotonic`)"
    )
    lines: int = Field(0, description="how many lines the read returned")
    last_at: float | None = Field(
        None,
        description="the newest line's time (seconds since boot), null when nothing was read",
    )


class Rail(Value):
    """One more RDMA port NCCL uses (`ray.env` NCCL_IB_HCA), read from
    /sys/class/infiniband: on a DGX Spark each QSFP port is two devices, one per PCIe x4 half."""

    device: str = Field(description="the RDMA device")
    port: int = Field(description="its port")
    port_state: str | None = Field(None, description="the port's `state` word: `ACTIVE` when sound")
    phys_state: str | None = Field(
        None, description="the port's `phys_state` word: `LinkUp` when sound"
    )
    rate_gbps: float | None = Field(None, description="the port's rate, Gb/s")
    roce_v2_gids: tuple[int, ...] = Field(
        (), description="the GID table rows holding a routable (not link-local) RoCE v2 address"
    )


class Fabric(Value):
    """The data interface's link and its RDMA port, from sysfs (None: not read or absent)."""

    mtu: int | None = Field(None, description="the interface's MTU")
    carrier_changes: int | None = Field(
        None, description="how often its carrier changed since boot: a rise is a flap"
    )
    rdma_device: str | None = Field(None, description="the RDMA device behind it")
    port: int | None = Field(None, description="its port on that device")
    port_state: str | None = Field(None, description="the port's `state` word: `ACTIVE` when sound")
    phys_state: str | None = Field(
        None, description="the port's `phys_state` word: `LinkUp` when sound"
    )
    rate_gbps: float | None = Field(None, description="the port's rate, Gb/s")
    gid_index: int | None = Field(
        None,
        description="the GID table row holding the data IP as RoCE v2 (what "
        "`NCCL_IB_GID_INDEX` must name)",
    )
    rails: tuple[Rail, ...] = Field(
        (), description="the other RDMA ports NCCL_IB_HCA names (the data device's excluded)"
    )


class CacheEntry(Value):
    """One entry of the model's compile cache (`model.cache_dir`) on a host."""

    name: str = Field(description="its name")
    mtime: float = Field(
        description="its modification time by the host's own clock (only ever compared with "
        "the same host's other entries)"
    )


class ForeignContainer(Value):
    """A running container not of sparkd's naming, as `docker inspect` reads its config: what sparkd
    compares with its config on first contact (core.judging.adopt). Read only while sparkd's own Ray
    container does not run on the host."""

    name: str = Field(description="the container's name")
    image: str = Field(description="the image it was created from (`Config.Image`), as named")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="its environment (`Config.Env`); the value of a name that looks like a "
        "secret (`KEY`, `TOKEN`, `SECRET`, `PASSWORD`) is replaced by `<redacted>`",
    )
    command: tuple[str, ...] = Field(
        (), description="what it runs: `Config.Entrypoint` then `Config.Cmd`, one word each"
    )
    processes: tuple[str, ...] = Field(
        (),
        description="its processes as `PID ARGS` (`docker top`), secret-looking option values "
        "redacted: where a `vllm serve` started with `docker exec -d` shows",
    )


class HostFacts(Value):
    """A host's reading: what one look at it found."""

    name: str = Field(description="the configured host name")
    error: HostError | None = Field(
        None,
        description="set when the host could not be observed: the other fields are then empty",
    )
    boot_id: str | None = Field(
        None, description="`/proc/sys/kernel/random/boot_id`: a change is a reboot"
    )
    units: tuple[UnitState, ...] = Field((), description="the configured cleanup units")
    containers: tuple[Container, ...] = Field((), description="every container, running or not")
    gpu_processes: tuple[GpuProcess, ...] = Field((), description="the GPU's compute processes")
    interface: Interface | None = Field(None, description="the data-plane interface")
    disk_free_bytes: int | None = Field(None, description="free bytes where the serve log lives")
    docker_disk_free_bytes: int | None = Field(
        None,
        description="free bytes on Docker's data root (`/var/lib/docker`), where containers write",
    )
    images: tuple[str, ...] | None = Field(
        None,
        description="local images (`repo:tag`); null when not observed (the planner then "
        "assumes nothing about them)",
    )
    image_id: str | None = Field(
        None,
        description="the ID the configured image tag points at on this host (`docker image "
        "inspect`)",
    )
    units_error: str | None = Field(
        None, description="why the units are unknown (a read that failed is unknown, never empty)"
    )
    gpu_error: str | None = Field(None, description="why the GPU processes are unknown")
    reaches: dict[str, bool] = Field(
        default_factory=dict,
        description="per other host's data IP, whether it answered one ping over the data link "
        "from this host at this look (absent: not read, or the ping failed otherwise)",
    )
    interface_error: str | None = Field(
        None,
        description="why the data-plane interface could not be read (renamed or gone: `Device "
        '"..." does not exist.`): its link is then unknown, never healthy',
    )
    docker_error: str | None = Field(
        None,
        description="why Docker did not answer while the host did (daemon down: `Cannot "
        "connect to the Docker daemon ...`, or hung until the tool timeout): `containers` is "
        "then unknown (empty), every GPU process's owner unknown, and on the head `serve` is "
        "null and Ray's `error` says Docker is not answering",
    )
    kernel: KernelLog | None = Field(
        None,
        description="this boot's kernel log tail (`journalctl -k -b -o short-monotonic -n "
        "200`); null when unread",
    )
    kernel_error: str | None = Field(
        None,
        description="why the kernel log is unknown (the tool failed, or the SSH user may not "
        "read the system journal)",
    )
    memory_available_bytes: int | None = Field(
        None,
        description="`MemAvailable` of /proc/meminfo: on GB10 GPU allocations come out of it "
        "(unified memory)",
    )
    memory_total_bytes: int | None = Field(None, description="`MemTotal` of /proc/meminfo")
    fabric: Fabric | None = Field(None, description="the data interface's link and RDMA port")
    cache_entries: tuple[CacheEntry, ...] | None = Field(
        None,
        description="the model's compile cache (`model.cache_dir`): its entries; null when "
        "unread or the directory does not exist yet",
    )
    cache_free_bytes: int | None = Field(
        None,
        description="free bytes on the compile cache's file system (read in the same `df` as "
        "the serve log's)",
    )
    model_files: ModelFiles | None = Field(
        None, description="the head's model directory, read only while a rollout prepares"
    )
    foreign: tuple[ForeignContainer, ...] | None = Field(
        None,
        description="the running containers' config, read while sparkd's own Ray container "
        "does not run on the host (first contact: core.judging.adopt); null when not read or the "
        "read failed",
    )
    foreign_error: str | None = Field(
        None,
        description="why the running containers' config could not be read on first contact: "
        "no Ray is started beside what may be a deployment made by hand until it is",
    )

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
    node_id: str = Field(description="Ray's node id")
    ip: str = Field(description="the node's IP")
    alive: bool = Field(description="whether Ray lists it `ALIVE`")
    gpus: float = Field(0.0, description="its GPUs")
    is_head: bool = Field(False, description="whether it is the head node")
    state_message: str | None = Field(None, description="why Ray says it died, if it says")


class RayState(Value):
    """Ray as the head sees it. `error` set means Ray did not answer (no cluster, or down)."""

    nodes: tuple[RayNode, ...] = Field((), description="the nodes Ray lists")
    gpus_total: float = Field(0.0, description="the GPUs of alive nodes")
    error: str | None = Field(
        None, description="set when Ray did not answer (no cluster, or the head is down)"
    )
    ips_known: bool = Field(
        True,
        description="false when only `ray status` answered (it names nodes, not their IPs): "
        "then only the GPU count is checked",
    )
    gpus_usable: float | None = Field(
        None,
        description="the GPUs `ray status` counts, when it was read beside the node list "
        "(while Ray settles: a node is listed ALIVE a few seconds before its GPU can be placed "
        "on)",
    )
    reused: bool = Field(
        False,
        description="this is the previous cycle's reading, not read again: the cluster was "
        "converged and nothing since (no event, no operator, no probe due) said Ray changed",
    )
    dashboard_refused: str | None = Field(
        None,
        description="set when the head's dashboard refused sparkd's read (Ray's token auth: "
        "HTTP 401 without `ray.auth_token_file`, 403 with another token), saying which; Ray was "
        "then read with the `ray` CLI in the head's container",
    )

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
    """How far the model's load has come, as its serve log shows it."""

    stage: LoadStage = Field(description="the stage the log last showed")
    percent: float | None = Field(None, description="the stage's progress, where the log counts it")
    progress_at: float | None = Field(
        None, description="when the log last showed progress (its host's clock)"
    )
    message: str = Field("", description="the log line that showed it")


PlacementStage = Literal["waiting", "placed"]


class Placement(Value):
    """The placement group of the running launch (vLLM's Ray executor), as its log shows it."""

    stage: PlacementStage = Field(
        description="`waiting`: vLLM asked Ray for its GPUs and waits (up to 30 minutes) for "
        "them; `placed`: the group is ready and its workers run"
    )
    nodes: tuple[str, ...] = Field(
        (), description="the Ray node ids the group was placed on, where the log names them"
    )


class ServeState(Value):
    """The `vllm serve` process in the head container."""

    running: bool = Field(description="whether the serve process runs")
    pid: int | None = Field(None, description="its PID in the head container")
    elapsed_seconds: float | None = Field(None, description="how long it has run (`ps` etime)")
    spec_hash: str | None = Field(None, description="the spec hash it was launched with")
    progress: LoadProgress | None = Field(None, description="how far its load has come")
    log_tail: tuple[str, ...] = Field(
        (), description="the last lines of the serve log, secrets redacted"
    )
    cpu_seconds: float | None = Field(
        None,
        description="CPU seconds used so far by the serve process and the engine processes "
        "beside it: a silent load stage (CUDA-graph capture, torch.compile) still burns CPU, "
        "a hang does not",
    )
    placement: Placement | None = Field(
        None,
        description="its Ray placement group as the log since launch shows it (none: the log "
        "says nothing of one)",
    )
    orphans: tuple[str, ...] = Field(
        (),
        description="with no serve process: vLLM engine processes left in the head container "
        "(an API server killed by SIGKILL leaves its EngineCore and workers running, holding "
        "the GPUs)",
    )


# `http_error`: the server answers, but refuses sparkd (a 401 from /v1/models: a wrong key).
EndpointStatus = Literal["up", "http_error", "refused", "timeout", "error", "not_run"]


class ModelEndpoint(Value):
    """The model's HTTP server, as `/health`, `/v1/models` and vLLM's `/metrics` answered."""

    status: EndpointStatus = Field(
        description="`refused` while vLLM loads (it refuses connections); `http_error` when it "
        "answered `/v1/models` with 401 or 403: the key was refused"
    )
    health_status: int | None = Field(None, description="the HTTP status of `/health`")
    models: tuple[str, ...] = Field(
        (),
        description="what `/v1/models` lists: the model is ours only if it lists the served name",
    )
    requests_running: float | None = Field(
        None, description="`vllm:num_requests_running`, summed over engines"
    )
    generation_tokens_total: float | None = Field(
        None, description="`vllm:generation_tokens_total`, summed over engines"
    )
    prompt_tokens_total: float | None = Field(
        None,
        description="`vllm:prompt_tokens_total`, summed over engines: counted when a prompt's "
        "prefill ends, not while it runs",
    )
    kv_cache_usage: float | None = Field(
        None,
        description="`vllm:kv_cache_usage_perc`, summed over engines: it moves with every "
        "engine step that takes or frees KV blocks, so it rises while a long prompt is "
        "prefilled and no token is counted",
    )
    max_model_len: int | None = Field(
        None,
        description="the served model's `max_model_len` in `/v1/models`: the longest prompt "
        "the engine takes, which bounds how long one prefill can last",
    )
    vllm_metrics: bool | None = Field(
        None,
        description="whether `/metrics` carried any `vllm:` family (false: it answered without "
        "one, as under `--disable-log-stats`); null when it was not read",
    )
    detail: str = Field("", description="what went wrong, when it did")

    @model_validator(mode="before")
    @classmethod
    def _drop_retired(cls, data: Any) -> Any:
        # Written (always null) before it was dropped: a document that has it still loads.
        if isinstance(data, dict) and "requests_waiting" in data:
            return {k: v for k, v in data.items() if k != "requests_waiting"}
        return data

    def serves(self, model_id: str) -> bool:
        return self.status == "up" and self.health_status == 200 and model_id in self.models


class Observed(Value):
    """A cycle's reading: every host's, and the cluster-wide reads made from the head."""

    cluster: str = Field(description="the configured cluster name")
    observed_at: float = Field(description="when the cycle looked")
    hosts: tuple[HostFacts, ...] = Field(description="each configured host's reading")
    ray: RayState | None = Field(None, description="Ray as the head sees it")
    serve: ServeState | None = Field(
        None, description="the `vllm serve` process in the head container"
    )
    endpoint: ModelEndpoint | None = Field(None, description="the model's HTTP server")
    probe: ProbeResult | None = Field(None, description="the probe this cycle sent, if it sent one")
    api_key_fingerprint: str | None = Field(
        None,
        description="a short hash of `model.api_key_file`'s content as read this cycle, never "
        "the key; null without a key file, or when it could not be read",
    )
    checks: tuple[CheckResult, ...] | None = Field(
        None,
        description="a rollout's acceptance checks, when this cycle ran them (with the probe "
        "that would accept the new spec)",
    )

    def host(self, name: str) -> HostFacts | None:
        return next((h for h in self.hosts if h.name == name), None)
