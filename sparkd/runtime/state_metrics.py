"""The state half of the metrics: gauges rendered at scrape time from what the controllers last
saw (phase, hosts, GPUs, load progress, the reasoning-only ratio), so a scrape never shows a
value that no cycle produced. The collector declares its families, so the registry refuses a
clashing name."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from sparkd.core.judging import engine_stats
from sparkd.core.policy import budget_used
from sparkd.model.observed import HostFacts
from sparkd.model.plan import ACTION_KINDS, PHASES, TRIAGE_CLASSES
from sparkd.model.probe import DEGRADED_CAUSES

if TYPE_CHECKING:
    from sparkd.runtime.controller import Controller


class StateCollector(Collector):
    """Renders each controller's latest view at scrape time."""

    def __init__(self, controllers: Callable[[], Iterable[Controller]]) -> None:
        self.controllers = controllers

    def describe(self) -> Iterator[Metric]:
        """The families this collector yields, so the registry refuses a clashing name."""
        yield from _Families().all()

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        for controller in self.controllers():
            families.add(controller)
        yield from families.all()


def gauge(name: str, doc: str, labels: tuple[str, ...] = ("cluster",)) -> GaugeMetricFamily:
    """A family of one scrape, a series per cluster unless other `labels` are given."""
    return GaugeMetricFamily(name, doc, labels=list(labels))


class _Families:
    def __init__(self) -> None:
        self.host_up = gauge(
            "sparkd_host_up", "The host answered the last observation", ("cluster", "host")
        )
        self.ray_nodes = gauge("sparkd_ray_nodes_alive", "Ray nodes alive, as the head sees them")
        self.ray_gpus = gauge("sparkd_ray_gpus", "GPUs in the Ray cluster")
        self.ray_gpus_desired = gauge("sparkd_ray_gpus_desired", "GPUs the Ray cluster should have")
        self.model_ready = gauge("sparkd_model_ready", "The endpoint serves the configured model")
        self.load_progress = gauge(
            "sparkd_model_load_progress_ratio", "Progress of the model load (1 when ready)"
        )
        self.loading = gauge(
            "sparkd_model_loading_seconds", "How long the load in progress has run (0 outside one)"
        )
        self.load_eta = gauge(
            "sparkd_model_load_eta_seconds",
            "Estimated time left in the load, from its progress so far (only while loading)",
        )
        self.phase = gauge(
            "sparkd_cluster_phase", "1 for the cluster's current phase", ("cluster", "phase")
        )
        self.converged = gauge("sparkd_cluster_converged", "Healthy with nothing left to do")
        self.paused = gauge(
            "sparkd_cluster_paused", "Observed but not acted on: an operator's pause or a window"
        )
        self.maintenance = gauge(
            "sparkd_cluster_maintenance", "Inside a configured maintenance window"
        )
        self.blocked = gauge("sparkd_cluster_blocked", "Latched blocked: needs a human")
        self.budget = gauge(
            "sparkd_remediation_budget_remaining",
            "Attempts left for the most-used target of each action kind in the budget window",
            ("cluster", "action"),
        )
        self.last_cycle = gauge(
            "sparkd_last_reconcile_timestamp_seconds", "When the last cycle finished"
        )
        # Not `sparkd_probe_completion_tokens`: that is the counter's family, and OpenMetrics
        # refuses two families of one name.
        self.tokens = gauge(
            "sparkd_probe_last_completion_tokens", "Completion tokens of the last probe"
        )
        self.ratio = gauge(
            "sparkd_probe_reasoning_only_ratio",
            "reasoning_only / (answer + reasoning_only) over the last 20 such probes",
        )
        self.last_success = gauge(
            "sparkd_probe_last_success_timestamp_seconds", "When a probe last answered healthily"
        )
        self.last_latency = gauge("sparkd_probe_last_duration_seconds", "Latency of the last probe")
        self.memory_available = gauge(
            "sparkd_host_memory_available_bytes",
            "MemAvailable of the host (on GB10 GPU allocations come out of it)",
            ("cluster", "host"),
        )
        self.degraded = gauge(
            "sparkd_model_degraded",
            "1 for the cause the last probe shows when a restart would not change it "
            "(overloaded: timed out while tokens flowed for others; output_fault: the turn "
            "reached no content)",
            ("cluster", "cause"),
        )
        self.triage = gauge(
            "sparkd_cluster_triage",
            "1 for each failure class below vLLM the planner recognises now (core.judging.triage)",
            ("cluster", "class"),
        )
        host_labels = ("cluster", "host")
        self.link_up = gauge(
            "sparkd_fabric_link_up", "The data interface's RDMA port is ACTIVE", host_labels
        )
        self.link_rate = gauge(
            # Bytes, as Prometheus names base units (promtool refuses bits): Gb/s x 1.25e8.
            "sparkd_fabric_link_rate_bytes_per_second",
            "The RDMA port's rate",
            host_labels,
        )
        self.mtu = gauge("sparkd_fabric_mtu_bytes", "The data interface's MTU", host_labels)
        self.gid_index = gauge(
            "sparkd_fabric_gid_index",
            "The GID table row holding the data IP as RoCE v2 (-1: none)",
            host_labels,
        )
        self.vllm_metrics_missing = gauge(
            "sparkd_model_vllm_metrics_missing",
            "1 when vLLM exports no vllm:* metrics (--disable-log-stats): hang detection and "
            "busy-or-hung read unknown",
        )
        self.info = InfoMetricFamily(
            "sparkd_model", "The model a cluster serves", labels=["cluster"]
        )
        self.events_coalesced = CounterMetricFamily(
            "sparkd_docker_events_coalesced",
            "docker events lines folded into a wake already due (at most one look per host "
            "per window) instead of each waking the controller",
            labels=list(host_labels),
        )
        self.event_storms = CounterMetricFamily(
            "sparkd_docker_event_storms",
            "docker events streams dropped for printing more lines in a window than a sane "
            "host does (set up again after a backoff)",
            labels=list(host_labels),
        )

    def add(self, controller: Controller) -> None:
        cluster = controller.cluster
        name = cluster.name
        view = controller.view
        memory = controller.memory
        now = controller.clock.now()
        self.ray_gpus_desired.add_metric([name], cluster.ray.expected_gpus)
        for spec in cluster.hosts:
            counts = controller.event_counts.get(spec.name)
            self.events_coalesced.add_metric([name, spec.name], counts.coalesced if counts else 0)
            self.event_storms.add_metric([name, spec.name], counts.storms if counts else 0)
        self.info.add_metric([name], {"model": cluster.model.id})
        plan = view.plan
        window = controller.maintenance_at(controller.wall_clock())
        self.maintenance.add_metric([name], 1.0 if window is not None else 0.0)
        blocked = memory.blocked is not None or (plan is not None and plan.phase == "blocked")
        self.blocked.add_metric([name], 1.0 if blocked else 0.0)
        for action in ACTION_KINDS:
            used = max(
                (
                    budget_used(memory, a.key, cluster.policy, now)
                    for a in memory.attempts
                    if a.key.startswith(f"{action}:")
                ),
                default=0,
            )
            self.budget.add_metric([name, action], max(0, cluster.policy.budget - used))
        if view.last_cycle_at is not None:
            self.last_cycle.add_metric([name], view.last_cycle_at)
        last = memory.last_probe
        cause = last.degraded_cause if last is not None else None
        for each in DEGRADED_CAUSES:
            self.degraded.add_metric([name, each], 1.0 if cause == each else 0.0)
        if last is not None:
            if last.verdict.completion_tokens is not None:
                self.tokens.add_metric([name], last.verdict.completion_tokens)
            if last.latency_seconds is not None:
                self.last_latency.add_metric([name], last.latency_seconds)
        ratio = view.reasoning_only_ratio
        if ratio is not None:
            self.ratio.add_metric([name], ratio)
        if view.last_probe_success_at is not None:
            self.last_success.add_metric([name], view.last_probe_success_at)
        if plan is not None:
            for phase in PHASES:
                self.phase.add_metric([name, phase], 1.0 if plan.phase == phase else 0.0)
            self.converged.add_metric([name], 1.0 if plan.converged else 0.0)
            self.paused.add_metric([name], 1.0 if plan.phase == "paused" else 0.0)
            for triage in TRIAGE_CLASSES:
                self.triage.add_metric([name, triage], 1.0 if triage in plan.triage else 0.0)
        observed = view.snapshot
        endpoint = observed.endpoint if observed is not None else None
        missing = engine_stats.missing(cluster, endpoint) is not None
        self.vllm_metrics_missing.add_metric([name], 1.0 if missing else 0.0)
        if observed is None:
            return
        for host in observed.hosts:
            self.host_up.add_metric([name, host.name], 1.0 if host.reachable else 0.0)
            if host.memory_available_bytes is not None:
                self.memory_available.add_metric([name, host.name], host.memory_available_bytes)
            self._fabric(name, host)
        ray = observed.ray
        alive = [n for n in ray.nodes if n.alive] if ray is not None and ray.up else []
        self.ray_nodes.add_metric([name], len(alive))
        self.ray_gpus.add_metric([name], ray.gpus_total if ray is not None and ray.up else 0.0)
        endpoint = observed.endpoint
        # The served name, as the planner and the probe use it: `--served-model-name` renames it.
        ready = endpoint is not None and endpoint.serves(cluster.model.served_name)
        self.model_ready.add_metric([name], 1.0 if ready else 0.0)
        serve = observed.serve
        progress = serve.progress if serve is not None else None
        fraction = (
            1.0
            if ready
            else (progress.percent / 100 if progress is not None and progress.percent else 0.0)
        )
        self.load_progress.add_metric([name], fraction)
        elapsed = 0.0
        if plan is not None and plan.phase == "loading":
            # The host's process age, in whole seconds; sparkd's own launch time when later.
            elapsed = (serve.elapsed_seconds or 0.0) if serve is not None else 0.0
            if memory.launched_at is not None:
                elapsed = max(elapsed, observed.observed_at - memory.launched_at)
        self.loading.add_metric([name], elapsed)
        if elapsed and fraction > 0:
            self.load_eta.add_metric([name], max(0.0, elapsed * (1 - fraction) / fraction))

    def _fabric(self, name: str, host: HostFacts) -> None:
        fabric = host.fabric
        if fabric is None:
            return
        labels = [name, host.name]
        if fabric.mtu is not None:
            self.mtu.add_metric(labels, fabric.mtu)
        if fabric.rdma_device is None:
            return
        self.link_up.add_metric(labels, 1.0 if fabric.port_state == "ACTIVE" else 0.0)
        if fabric.rate_gbps is not None:
            self.link_rate.add_metric(labels, fabric.rate_gbps * 1e9 / 8)
        self.gid_index.add_metric(labels, fabric.gid_index if fabric.gid_index is not None else -1)

    def all(self) -> Iterator[Metric]:
        yield from (
            self.host_up,
            self.ray_nodes,
            self.ray_gpus,
            self.ray_gpus_desired,
            self.model_ready,
            self.load_progress,
            self.loading,
            self.load_eta,
            self.phase,
            self.converged,
            self.paused,
            self.maintenance,
            self.blocked,
            self.budget,
            self.last_cycle,
            self.tokens,
            self.ratio,
            self.last_success,
            self.last_latency,
            self.memory_available,
            self.degraded,
            self.triage,
            self.link_up,
            self.link_rate,
            self.mtu,
            self.gid_index,
            self.vllm_metrics_missing,
            self.info,
            self.events_coalesced,
            self.event_storms,
        )
