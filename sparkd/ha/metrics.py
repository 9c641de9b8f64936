"""The HA series, read from the ownership state at scrape time (registered only with `[ha]`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sparkd.ha.ownership import Ownership


class HaCollector(Collector):
    def __init__(self, ownership: Ownership) -> None:
        self.ownership = ownership

    def collect(self) -> Iterator[Metric]:
        ha = self.ownership
        owner = GaugeMetricFamily(
            "sparkd_ha_owner",
            "1 while this instance owns the cluster and may act on it, else 0",
            labels=["cluster"],
        )
        token = GaugeMetricFamily(
            "sparkd_ha_token",
            "The fencing token (the owner key's etcd create revision) while owner, else 0",
            labels=["cluster"],
        )
        mismatch = GaugeMetricFamily(
            "sparkd_ha_fence_mismatch",
            "Hosts of the cluster whose fence refuses every token (another etcd cluster's "
            "record, or an unreadable one) until `sparkd ha refence CLUSTER`",
            labels=["cluster"],
        )
        for name in sorted(ha.claims):
            owner.add_metric([name], 1.0 if ha.may_act(name) else 0.0)
            token.add_metric([name], float(ha.token(name) or 0))
            mismatch.add_metric([name], float(len(ha.claims[name].mismatched)))
        yield owner
        yield token
        yield mismatch
        yield GaugeMetricFamily(
            "sparkd_ha_lease_remaining_seconds",
            "Time until this instance's etcd lease may have expired, from its last good renewal",
            value=ha.lease_remaining(),
        )
        yield GaugeMetricFamily(
            "sparkd_ha_etcd_up", "1 when the latest renewal round reached etcd", value=ha.reachable
        )
        yield CounterMetricFamily(
            "sparkd_ha_renew_failures",
            "Renewal rounds that did not reach etcd or got an error from it",
            value=ha.renew_failures,
        )
        yield CounterMetricFamily(
            "sparkd_ha_takeovers",
            "Clusters this instance acquired after seeing another instance own them",
            value=ha.takeovers,
        )
        yield CounterMetricFamily(
            "sparkd_ha_fenced",
            "Mutating commands a host refused (exit 76): a newer owner's token was recorded there",
            value=ha.fenced_total,
        )
