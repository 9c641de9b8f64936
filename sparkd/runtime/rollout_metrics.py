"""Rollout metrics: whether one is on, whether a rollback holds, the last downtime, and the
results rollouts reached (counted once each, as a cycle first shows them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from sparkd.core import spec
from sparkd.model.cluster import ClusterSpec
from sparkd.runtime.state_metrics import gauge

if TYPE_CHECKING:
    from sparkd.runtime.cluster_view import CycleRecord
    from sparkd.runtime.controller import Controller

RESULTS = ("accepted", "rolled_back", "rollback_failed")


class RolloutMetrics:
    def __init__(
        self, registry: CollectorRegistry, controllers: Callable[[], Iterable[Controller]]
    ) -> None:
        self.results = Counter(
            "sparkd_rollouts",
            "Results rollouts reached: accepted, rolled_back, rollback_failed",
            ["cluster", "result"],
            registry=registry,
        )
        registry.register(_Gauges(controllers))

    def track(self, cluster: ClusterSpec) -> None:
        for result in RESULTS:
            self.results.labels(cluster.name, result)

    def record(self, controller: Controller, record: CycleRecord) -> None:
        for result in record.rollout_results:
            if result in RESULTS:
                self.results.labels(controller.cluster.name, result).inc()


class _Gauges(Collector):
    def __init__(self, controllers: Callable[[], Iterable[Controller]]) -> None:
        self.controllers = controllers

    def describe(self) -> Iterator[Metric]:
        """The families this collector yields, so the registry refuses a clashing name."""
        yield from _families()

    def collect(self) -> Iterator[Metric]:
        on, back, downtime = _families()
        for controller in self.controllers():
            name = controller.cluster.name
            record = controller.memory.rollout
            ours = record is not None and record.to_hash == spec.identity(controller.cluster)
            result = record.result if ours and record is not None else None
            on.add_metric([name], 1.0 if result == "in_progress" else 0.0)
            back.add_metric([name], 1.0 if result == "rolled_back" else 0.0)
            last = controller.memory.rollout_downtime
            if last is not None:
                downtime.add_metric([name], last)
        yield on
        yield back
        yield downtime


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    on = gauge("sparkd_rollout_in_progress", "A spec change is being rolled out")
    back = gauge(
        "sparkd_rollout_rolled_back",
        "A rollback to the last-good spec holds (until the config changes or a retry)",
    )
    downtime = gauge(
        "sparkd_rollout_downtime_seconds",
        "The last accepted rollout's downtime: old serve stopped to new one accepted",
    )
    return on, back, downtime
