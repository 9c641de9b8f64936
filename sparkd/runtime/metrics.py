"""Prometheus metrics: counters for events, a collector over the controllers' latest state.

Events (probes, remediations, reboots, SSH errors, cycles) are counted as they happen, from the
one record each cycle hands over. Everything that is a state (phase, GPUs, load progress, the
reasoning-only ratio) is rendered at scrape time from what the controllers last saw, so a scrape
never shows a value that no cycle produced. Labels are bounded sets: cluster and host names from
the config, phases, outcomes, action kinds and results, error kinds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
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

from sparkd import __version__
from sparkd.core.policy import counts_as_failure
from sparkd.core.reading import kernel
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import HOST_ERROR_KINDS, KERNEL_KINDS, HostFacts
from sparkd.model.plan import ACTION_KINDS, ACTION_RESULTS
from sparkd.model.probe import PROBE_OUTCOMES
from sparkd.runtime.rollout_metrics import RolloutMetrics
from sparkd.runtime.state_metrics import StateCollector

if TYPE_CHECKING:
    from sparkd.runtime.cluster_view import CycleRecord
    from sparkd.runtime.controller import Controller

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

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, ["cluster", *labels], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["cluster"], buckets=buckets, registry=r)

        self.probe_duration = histogram(
            "sparkd_probe_duration_seconds",
            "Latency of the sanity probe, request to last byte",
            PROBE_BUCKETS,
        )
        self.probe_ttft = histogram(
            "sparkd_probe_ttft_seconds",
            "Time to the first token of a streaming probe",
            TTFT_BUCKETS,
        )
        self.probes = counter("sparkd_probes", "Probes by outcome", "outcome")
        self.probe_failures = counter(
            "sparkd_probe_failures",
            "Probes that count as a model failure (not not_run, a busy timeout or an output fault)",
        )
        self.completion_tokens = counter(
            "sparkd_probe_completion_tokens", "Completion tokens the probes generated"
        )
        self.reboots = counter("sparkd_host_reboots", "Reboots seen (boot id changed)", "host")
        self.ssh_errors = counter(
            "sparkd_ssh_errors",
            "Observations of a host that failed, by error kind",
            "host",
            "reason",
        )
        self.remediations = counter(
            "sparkd_remediations", "Remediations run, by action kind and result", "action", "result"
        )
        self.reconcile_duration = histogram(
            "sparkd_reconcile_duration_seconds",
            "Duration of one cycle: observe, plan and act",
            RECONCILE_BUCKETS,
        )
        self.cycles = counter("sparkd_reconcile_cycles", "Cycles by result", "result")
        self.kernel_events = counter(
            "sparkd_host_kernel_events",
            "Kernel log lines sparkd judges, by class, counted once each (floods included)",
            "host",
            "class",
        )
        self.xids = counter(
            "sparkd_gpu_xid",
            "NVIDIA XID lines in the kernel log, by XID (`other`: not in sparkd's catalogue)",
            "host",
            "xid",
        )
        self.flaps = counter(
            "sparkd_fabric_flaps",
            "Data link flaps (each down and up again: two carrier changes)",
            "host",
        )
        self.power_cycles = counter(
            "sparkd_power_cycles",
            "Power cycles of wedged hosts run through [clusters.power] command, by result",
            "host",
            "result",
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
