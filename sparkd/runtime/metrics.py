"""Prometheus metrics: counters for events, a collector over the controllers' latest state.

Events (probes, remediations, reboots, SSH errors, cycles) are counted as they happen, from the
one record each cycle hands over. Everything that is a state (phase, GPUs, load progress, the
reasoning-only ratio) is rendered at scrape time from what the controllers last saw, so a scrape
never shows a value that no cycle produced. Labels are bounded sets: cluster and host names from
the config, phases, outcomes, action kinds and results, error kinds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from sparkd import __version__
from sparkd.core import kernel
from sparkd.core.policy import budget_used, counts_as_failure
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import HOST_ERROR_KINDS, KERNEL_KINDS, HostFacts
from sparkd.model.plan import ACTION_KINDS, ACTION_RESULTS, PHASES, TRIAGE_CLASSES
from sparkd.model.probe import PROBE_OUTCOMES
from sparkd.runtime.rollout_metrics import RolloutMetrics

if TYPE_CHECKING:
    from sparkd.runtime.controller import Controller, CycleRecord

# Every probe threshold in the rules and the default probe timeout (30 s) are boundaries here.
PROBE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 90, 120)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
# A cycle includes its actions: a Ray start or a model launch takes minutes.
RECONCILE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
CYCLE_RESULTS = ("ok", "error")
# A power cycle is run or it is not: "skipped" never applies (the planner withholds it instead).
POWER_RESULTS = ("ok", "failed", "timeout")


def revision() -> str:
    """The source revision the build came from (`SPARKD_REVISION`, set by the image build)."""
    return os.environ.get("SPARKD_REVISION", "").strip() or "unknown"


class Metrics:
    """The daemon's registry: process and platform metrics, event counters, the state view."""

    def __init__(self, controllers: Callable[[], Iterable[Controller]]) -> None:
        # Counters' `_created` series would double every counter in OpenMetrics scrapes.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        r = self.registry
        Info("build", "sparkd's version and source revision", namespace="sparkd", registry=r).info(
            {"version": __version__, "revision": revision()}
        )
        self.probe_duration = Histogram(
            "sparkd_probe_duration_seconds",
            "Latency of the sanity probe, request to last byte",
            ["cluster"],
            buckets=PROBE_BUCKETS,
            registry=r,
        )
        self.probe_ttft = Histogram(
            "sparkd_probe_ttft_seconds",
            "Time to the first token of a streaming probe",
            ["cluster"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.probes = Counter(
            "sparkd_probes", "Probes by outcome", ["cluster", "outcome"], registry=r
        )
        self.probe_failures = Counter(
            "sparkd_probe_failures",
            "Probes that count as a model failure (not not_run, not a busy timeout)",
            ["cluster"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "sparkd_probe_completion_tokens",
            "Completion tokens the probes generated",
            ["cluster"],
            registry=r,
        )
        self.reboots = Counter(
            "sparkd_host_reboots", "Reboots seen (boot id changed)", ["cluster", "host"], registry=r
        )
        self.ssh_errors = Counter(
            "sparkd_ssh_errors",
            "Observations of a host that failed, by error kind",
            ["cluster", "host", "reason"],
            registry=r,
        )
        self.remediations = Counter(
            "sparkd_remediations",
            "Remediations run, by action kind and result",
            ["cluster", "action", "result"],
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "sparkd_reconcile_duration_seconds",
            "Duration of one cycle: observe, plan and act",
            ["cluster"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.cycles = Counter(
            "sparkd_reconcile_cycles", "Cycles by result", ["cluster", "result"], registry=r
        )
        self.kernel_events = Counter(
            "sparkd_host_kernel_events",
            "Kernel log lines sparkd judges, by class, counted once each (floods included)",
            ["cluster", "host", "class"],
            registry=r,
        )
        self.xids = Counter(
            "sparkd_gpu_xid",
            "NVIDIA XID lines in the kernel log, by XID (`other`: not in sparkd's catalogue)",
            ["cluster", "host", "xid"],
            registry=r,
        )
        self.flaps = Counter(
            "sparkd_fabric_flaps",
            "Data link flaps (each down and up again: two carrier changes)",
            ["cluster", "host"],
            registry=r,
        )
        self.power_cycles = Counter(
            "sparkd_power_cycles",
            "Power cycles of wedged hosts run through [clusters.power] command, by result",
            ["cluster", "host", "result"],
            registry=r,
        )
        self._carriers: dict[tuple[str, str], tuple[str | None, int]] = {}
        # Per (cluster, host): the boot and the newest kernel timestamp counted so far.
        self._kernel_marks: dict[tuple[str, str], tuple[str | None, float | None]] = {}
        r.register(StateCollector(controllers))
        self.rollouts = RolloutMetrics(r, controllers)

    def track(self, cluster: ClusterSpec) -> None:
        """Export every bounded label combination of a cluster at 0 before it happens."""
        name = cluster.name
        self.probe_duration.labels(name)
        self.probe_ttft.labels(name)
        self.probe_failures.labels(name)
        self.completion_tokens.labels(name)
        self.reconcile_duration.labels(name)
        for outcome in PROBE_OUTCOMES:
            self.probes.labels(name, outcome)
        for host in cluster.hosts:
            self.reboots.labels(name, host.name)
            self.flaps.labels(name, host.name)
            for result in POWER_RESULTS:
                self.power_cycles.labels(name, host.name, result)
            for event_kind in KERNEL_KINDS:
                self.kernel_events.labels(name, host.name, event_kind)
            for kind in HOST_ERROR_KINDS:
                self.ssh_errors.labels(name, host.name, kind)
        for action in ACTION_KINDS:
            for result in ACTION_RESULTS:
                self.remediations.labels(name, action, result)
        for result in CYCLE_RESULTS:
            self.cycles.labels(name, result)
        self.rollouts.track(cluster)

    def record(self, controller: Controller, record: CycleRecord) -> None:
        name = controller.cluster.name
        self.cycles.labels(name, "ok" if record.ok else "error").inc()
        self.reconcile_duration.labels(name).observe(record.seconds)
        if record.observed is not None:
            for host in record.observed.hosts:
                if host.error is not None:
                    self.ssh_errors.labels(name, host.name, host.error.kind).inc()
                self._count_kernel(name, host)
                self._count_flaps(name, host)
        for host_name in record.rebooted:
            self.reboots.labels(name, host_name).inc()
        self.rollouts.record(controller, record)
        for outcome in record.outcomes:
            self.remediations.labels(name, outcome.action.kind, outcome.result).inc()
            if outcome.action.kind == "power_cycle" and outcome.result in POWER_RESULTS:
                self.power_cycles.labels(name, outcome.action.host, outcome.result).inc()
        probe = record.probe
        if probe is not None:
            self.probes.labels(name, probe.outcome).inc()
            if counts_as_failure(probe):
                self.probe_failures.labels(name).inc()
            if probe.latency_seconds is not None:
                self.probe_duration.labels(name).observe(probe.latency_seconds)
            if probe.ttft_seconds is not None:
                self.probe_ttft.labels(name).observe(probe.ttft_seconds)
            if probe.verdict.completion_tokens:
                self.completion_tokens.labels(name).inc(probe.verdict.completion_tokens)

    def _count_kernel(self, cluster: str, host: HostFacts) -> None:
        """Each kernel line once: only what is newer than the last line counted in this boot
        (the fact script reads the same tail again every cycle)."""
        log = host.kernel
        if log is None or log.last_at is None:
            return
        boot, mark = self._kernel_marks.get((cluster, host.name), (None, None))
        if boot != host.boot_id:
            mark = None
        for event, fresh in kernel.new_since(log, mark):
            self.kernel_events.labels(cluster, host.name, event.kind).inc(fresh)
            if event.xid is not None:
                xid = str(event.xid) if event.xid in kernel.XIDS else "other"
                self.xids.labels(cluster, host.name, xid).inc(fresh)
        self._kernel_marks[(cluster, host.name)] = (host.boot_id, max(log.last_at, mark or 0.0))

    def _count_flaps(self, cluster: str, host: HostFacts) -> None:
        count = host.fabric.carrier_changes if host.fabric is not None else None
        if count is None:
            return
        key = (cluster, host.name)
        boot, before = self._carriers.get(key, (host.boot_id, count))
        if boot == host.boot_id and count > before:
            self.flaps.labels(cluster, host.name).inc(max(1, (count - before) // 2))
        self._carriers[key] = (host.boot_id, count)


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


class _Families:
    def __init__(self) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("cluster",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

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
        self.triage = gauge(
            "sparkd_cluster_triage",
            "1 for each failure class below vLLM the planner recognises now (core.triage)",
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
        self.info = InfoMetricFamily(
            "sparkd_model", "The model a cluster serves", labels=["cluster"]
        )

    def add(self, controller: Controller) -> None:
        cluster = controller.cluster
        name = cluster.name
        view = controller.view
        memory = controller.memory
        now = controller.clock.now()
        self.ray_gpus_desired.add_metric([name], cluster.ray.expected_gpus)
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
            self.triage,
            self.link_up,
            self.link_rate,
            self.mtu,
            self.gid_index,
            self.info,
        )
