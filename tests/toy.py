"""A toy cluster made of values, for planner tests: it produces snapshots and applies the
effects of successful actions, so a test can walk a whole recovery without any I/O.

It deliberately knows nothing of the planner's rules; it only models what the hosts would show.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sparkd.core.spec import (
    LABEL_CLUSTER,
    LABEL_ROLE,
    LABEL_SPEC,
    container_name,
    model_spec_hash,
    ray_spec_hash,
)
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import (
    SILENT_ERRORS,
    Container,
    ForeignContainer,
    GpuProcess,
    HostError,
    HostErrorKind,
    HostFacts,
    LoadProgress,
    ModelEndpoint,
    Observed,
    RayNode,
    RayState,
    ServeState,
    UnitState,
)
from sparkd.model.plan import Action
from sparkd.model.probe import ProbeOutcome, ProbeResult, ProbeVerdict
from sparkd.settings import load_settings

if TYPE_CHECKING:
    from sparkd.runtime.controller import Controller

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CONFIG = ROOT / "etc" / "sparkd" / "sparkd.toml"
T0 = 1_796_000_000.0  # 2026-11-29, a fixed epoch for reproducible snapshots
GLM_IMAGE = "hellohal2064/vllm-glm47-gb10:latest"


def reference_cluster() -> ClusterSpec:
    return load_settings(EXAMPLE_CONFIG).clusters[0]


@dataclass
class Unit:
    active: bool
    enabled: bool


@dataclass
class Toy:
    cluster: ClusterSpec
    now: float = T0
    units: dict[str, dict[str, Unit]] = field(default_factory=dict)
    containers: dict[str, dict[str, Container]] = field(default_factory=dict)
    gpu: dict[str, list[GpuProcess]] = field(default_factory=dict)
    errors: dict[str, HostError] = field(default_factory=dict)
    boot_ids: dict[str, str] = field(default_factory=dict)
    images: dict[str, list[str]] = field(default_factory=dict)
    ray_nodes: list[RayNode] = field(default_factory=list)
    node_serial: int = 0
    serve_started: float | None = None
    serve_spec: str | None = None
    serve_running: bool = False
    load_seconds: float = 900.0
    load_stalled_at: float | None = None
    load_failed: bool = False
    progress_at: float | None = None
    ready: bool = False
    probe_style: ProbeOutcome = "reasoning_only"
    probe_at: float | None = None
    # On a timeout, whether the probe met a busy engine; None: busy or hung unknown (vLLM's
    # metrics unread, `--disable-log-stats`).
    probe_busy: bool | None = False
    # The HTTP status of an `http_error` probe.
    probe_status: int | None = None
    # Hosts only the ops box cannot reach (its path to them lost): the other hosts still do.
    path_lost: set[str] = field(default_factory=set)
    probe_interval: float = 60.0
    log_tail: tuple[str, ...] = ()
    # vLLM's generation-token counter: it moves while the engine is busy, unless hung (requests
    # stay running, the counter stands still).
    tokens: float = 12345.0
    hung_under_load: bool = False
    # vLLM's KV-cache usage (`vllm:kv_cache_usage_perc`; None: not exported): it rises while a
    # long prompt is prefilled (`prefilling`: one request running, no token counted), and
    # stands still in a hang. `max_model_len` is what `/v1/models` says.
    kv_cache_usage: float | None = 0.25
    prefilling: bool = False
    max_model_len: int | None = 262144

    # -- construction -------------------------------------------------------------------

    @classmethod
    def empty(cls, cluster: ClusterSpec | None = None) -> Toy:
        spec = cluster or reference_cluster()
        toy = cls(cluster=spec)
        for host in spec.hosts:
            toy.units[host.name] = {}
            toy.containers[host.name] = {}
            toy.gpu[host.name] = []
            toy.boot_ids[host.name] = f"boot-{host.name}-1"
            toy.images[host.name] = [f"{spec.ray.image}:latest", GLM_IMAGE]
        return toy

    @classmethod
    def seed_morning(cls, cluster: ClusterSpec | None = None) -> Toy:
        """Both hosts just rebooted: stale units on the head, GLM containers auto-started."""
        toy = cls.empty(cluster)
        head = toy.cluster.head.name
        for unit in toy.cluster.cleanup.units:
            toy.units[head][unit] = Unit(active=True, enabled=True)
        for host in toy.cluster.hosts:
            toy.containers[host.name]["glm-flash"] = Container(
                name="glm-flash",
                image=GLM_IMAGE,
                state="running",
                labels={"com.docker.compose.project": "glm"},
                started_at=toy.now - 120,
                status="Up 2 minutes",
            )
            toy.gpu[host.name].append(
                GpuProcess(pid=4100, name="python3", used_memory_mib=1024, container="glm-flash")
            )
        return toy

    @classmethod
    def healthy(cls, cluster: ClusterSpec | None = None) -> Toy:
        toy = cls.empty(cluster)
        for host in toy.cluster.hosts:
            kind = "start_ray_head" if host.role == "head" else "start_ray_worker"
            toy.apply(Action(kind=kind, host=host.name, target="", reason="setup"))
        toy.apply(Action(kind="start_model", host=toy.cluster.head.name, target="", reason=""))
        toy.advance(toy.load_seconds + 1)
        toy.probe_at = toy.now
        return toy

    def copy(self) -> Toy:
        return copy.deepcopy(self)

    # -- effects ------------------------------------------------------------------------

    def apply(self, action: Action) -> None:
        spec = self.cluster
        host = action.host
        if action.kind == "stop_unit":
            self.units[host][action.target] = Unit(active=False, enabled=False)
        elif action.kind == "remove_container":
            self.containers[host].pop(action.target, None)
            self.gpu[host] = [p for p in self.gpu[host] if p.container != action.target]
        elif action.kind == "kill_gpu_process":
            self.gpu[host] = [p for p in self.gpu[host] if str(p.pid) != action.target]
        elif action.kind in ("start_ray_head", "start_ray_worker", "restart_ray"):
            hs = spec.host(host)
            name = container_name(spec, hs)
            self.containers[host][name] = Container(
                name=name,
                image=spec.ray.image,
                state="running",
                labels={
                    LABEL_CLUSTER: spec.name,
                    LABEL_ROLE: hs.role,
                    LABEL_SPEC: ray_spec_hash(spec, hs),
                },
                started_at=self.now,
                status="Up 1 second",
            )
            if hs.role == "head":
                self.ray_nodes = []
                self._stop_serve()
            self.ray_nodes = [n for n in self.ray_nodes if n.ip != hs.ip]
            self.node_serial += 1
            self.ray_nodes.append(
                RayNode(
                    node_id=f"node{self.node_serial:02d}",
                    ip=hs.ip,
                    alive=True,
                    gpus=1.0,
                    is_head=hs.role == "head",
                )
            )
            if hs.role == "worker":
                self._stop_serve()
        elif action.kind in ("start_model", "restart_model"):
            self.serve_running = True
            self.serve_started = self.now
            self.serve_spec = model_spec_hash(spec)
            self.progress_at = self.now
            self.ready = False
            self.probe_at = None
        else:
            raise AssertionError(action.kind)

    def _stop_serve(self) -> None:
        self.serve_running = False
        self.ready = False

    def advance(self, seconds: float) -> None:
        self.now += seconds
        if self.serve_running and not self.ready and self.serve_started is not None:
            frozen = self.load_stalled_at is not None
            elapsed = self.now - self.serve_started
            if not frozen:
                self.progress_at = self.now
            if elapsed >= self.load_seconds and not frozen:
                self.ready = True
        if self.ready and self.probe_busy and not self.hung_under_load:
            self.tokens += 20.0 * seconds
        if self.ready and self.prefilling and self.kv_cache_usage is not None:
            # Two Sparks prefill about 2k tokens/s: 125 blocks of 16 tokens a second, of a
            # cache of a million blocks.
            self.kv_cache_usage = min(1.0, self.kv_cache_usage + 125e-6 * seconds)
        if self.ready and (self.probe_at is None or self.now - self.probe_at >= 0):
            self.probe_at = self.now

    def reboot(self, host: str) -> None:
        """Containers without a restart policy die; GLM comes back; Ray loses the node."""
        hs = self.cluster.host(host)
        self.boot_ids[host] = self.boot_ids[host] + "+"
        self.containers[host] = {
            n: c for n, c in self.containers[host].items() if not n.startswith("sparkd-")
        }
        self.containers[host]["glm-flash"] = Container(
            name="glm-flash", image=GLM_IMAGE, state="running", started_at=self.now
        )
        self.ray_nodes = [n for n in self.ray_nodes if n.ip != hs.ip]
        if hs.role == "head":
            self.ray_nodes = []
        self._stop_serve()

    def unreachable(self, host: str, kind: HostErrorKind = "unreachable") -> None:
        self.errors[host] = HostError(kind=kind, detail="No route to host")

    def controller(self, state: Path, clock: list[float]) -> Controller:
        """A controller of this toy's cluster with no SSH and no event watch, whose wall and
        monotonic clocks both read `clock[0]` (a test moves it)."""
        from sparkd.runtime.controller import Controller
        from sparkd.runtime.state import StateDir
        from sparkd.shell.ssh import SshPool

        return Controller(
            self.cluster,
            cast(SshPool, None),
            StateDir(state),
            wall_clock=lambda: clock[0],
            monotonic=lambda: clock[0],
            watch_events=False,
        )

    # -- observation --------------------------------------------------------------------

    def _reached(self, name: str) -> bool:
        """Whether another host's ping over the data link reaches `name`: not when it is silent
        (a wedge: its kernel answers nothing), unless only the ops box's path to it is lost."""
        error = self.errors.get(name)
        silent = error is not None and error.kind in SILENT_ERRORS
        return not silent or name in self.path_lost

    def observe(self) -> Observed:
        spec = self.cluster
        hosts = []
        for hs in spec.hosts:
            if hs.name in self.errors:
                hosts.append(HostFacts(name=hs.name, error=self.errors[hs.name]))
                continue
            hosts.append(
                HostFacts(
                    name=hs.name,
                    boot_id=self.boot_ids[hs.name],
                    units=tuple(
                        UnitState(
                            name=n,
                            active_state="active" if u.active else "inactive",
                            sub_state="running" if u.active else "dead",
                            unit_file_state="enabled" if u.enabled else "disabled",
                        )
                        for n, u in sorted(self.units[hs.name].items())
                    ),
                    containers=tuple(self.containers[hs.name].values()),
                    foreign=self._foreign(hs.name, container_name(spec, hs)),
                    gpu_processes=tuple(self.gpu[hs.name]),
                    images=tuple(self.images[hs.name]),
                    disk_free_bytes=500 * 2**30,
                    reaches={
                        peer.data_ip: self._reached(peer.name)
                        for peer in spec.hosts
                        if peer.name != hs.name
                    },
                )
            )
        head = spec.head
        head_up = head.name not in self.errors
        has_head_box = container_name(spec, head) in self.containers[head.name]
        ray: RayState | None = None
        serve: ServeState | None = None
        endpoint: ModelEndpoint | None = None
        probe: ProbeResult | None = None
        if head_up:
            if has_head_box and self.ray_nodes:
                nodes = tuple(self.ray_nodes)
                ray = RayState(nodes=nodes, gpus_total=sum(n.gpus for n in nodes if n.alive))
            else:
                ray = RayState(error="no Ray cluster is running")
            serve = self._serve_state()
            endpoint = self._endpoint()
            probe = self._probe()
        return Observed(
            cluster=spec.name,
            observed_at=self.now,
            hosts=tuple(hosts),
            ray=ray,
            serve=serve,
            endpoint=endpoint,
            probe=probe,
        )

    def _foreign(self, host: str, own: str) -> tuple[ForeignContainer, ...] | None:
        """What the fact script reads of the running containers while sparkd's own does not
        run (the toy's other containers run no `ray start`)."""
        boxes = self.containers[host]
        if own in boxes and boxes[own].running:
            return None
        return tuple(
            ForeignContainer(name=c.name, image=c.image) for c in boxes.values() if c.running
        )

    def _serve_state(self) -> ServeState:
        if not self.serve_running or self.serve_started is None:
            return ServeState(running=False, log_tail=self.log_tail)
        elapsed = self.now - self.serve_started
        if self.load_failed:
            message = self.log_tail[-1] if self.log_tail else "load failed"
            progress = LoadProgress(stage="failed", progress_at=self.progress_at, message=message)
        elif self.ready:
            progress = LoadProgress(stage="ready", percent=100.0, progress_at=self.progress_at)
        else:
            pct = min(99.0, round(100.0 * elapsed / self.load_seconds))
            if self.load_stalled_at is not None:
                pct = min(
                    99.0,
                    round(100.0 * (self.load_stalled_at - self.serve_started) / self.load_seconds),
                )
            progress = LoadProgress(stage="weights", percent=pct, progress_at=self.progress_at)
        return ServeState(
            running=True,
            pid=5150,
            elapsed_seconds=elapsed,
            spec_hash=self.serve_spec,
            progress=progress,
            log_tail=self.log_tail,
        )

    def _endpoint(self) -> ModelEndpoint:
        if not self.ready:
            return ModelEndpoint(status="refused", detail="connection refused")
        return ModelEndpoint(
            status="up",
            health_status=200,
            models=(self.cluster.model.served_name,),
            requests_running=1.0
            if self.probe_busy or self.hung_under_load or self.prefilling
            else 0.0,
            generation_tokens_total=self.tokens,
            kv_cache_usage=self.kv_cache_usage,
            max_model_len=self.max_model_len,
        )

    def _probe(self) -> ProbeResult | None:
        if self.probe_at is None or not self.serve_running:
            return None
        outcome = self.probe_style
        healthy = None if outcome == "not_run" else outcome in ("answer", "reasoning_only")
        tokens = self.cluster.probe.max_tokens if outcome == "reasoning_only" else None
        return ProbeResult(
            at=self.probe_at,
            verdict=ProbeVerdict(
                outcome=outcome,
                healthy=healthy,
                completion_tokens=tokens,
                finish_reason="length" if outcome == "reasoning_only" else None,
            ),
            latency_seconds=self.cluster.probe.timeout if outcome == "timeout" else 1.25,
            tokens_advanced=self.probe_busy,
            http_status=self.probe_status if outcome == "http_error" else None,
        )
