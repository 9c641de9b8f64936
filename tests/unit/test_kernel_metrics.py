"""Kernel lines are counted once each although every look reads the same tail again."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sparkd.core.reading import kernel
from sparkd.model.observed import HostFacts, Observed
from sparkd.runtime.cluster_view import CycleRecord
from sparkd.runtime.metrics import Metrics
from tests.toy import reference_cluster

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"


def look(metrics: Metrics, text: str, boot: str = "boot-1") -> None:
    cluster = reference_cluster()
    hosts = tuple(
        HostFacts(
            name=h.name,
            boot_id=boot,
            kernel=kernel.parse_kernel_log(text) if h.name == "spark-b" else None,
        )
        for h in cluster.hosts
    )
    observed = Observed(cluster=cluster.name, observed_at=1.0, hosts=hosts)
    controller: Any = SimpleNamespace(cluster=cluster)
    metrics.record(controller, CycleRecord(ok=True, seconds=0.1, observed=observed))


def count(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"cluster": "sparks", **labels})


def test_each_line_counts_once_and_a_new_boot_starts_over() -> None:
    metrics = Metrics(lambda: [])
    metrics.track(reference_cluster())
    assert (
        count(metrics, "sparkd_host_kernel_events_total", host="spark-b", **{"class": "xid"}) == 0
    )
    xid13 = (KERNEL / "xid-13.txt").read_text()
    look(metrics, xid13)
    look(metrics, xid13)
    assert count(metrics, "sparkd_gpu_xid_total", host="spark-b", xid="13") == 3
    # The next look's tail: the same lines, then newer ones (9312 s and 13021 s after boot).
    newer = (KERNEL / "nv-no-memory.txt").read_text() + (KERNEL / "soft-lockup.txt").read_text()
    look(metrics, xid13 + newer)
    look(metrics, xid13 + newer)
    assert count(metrics, "sparkd_gpu_xid_total", host="spark-b", xid="13") == 3
    for kind, n in (("nv_no_memory", 3), ("soft_lockup", 2), ("xid", 3), ("aer_fatal", 0)):
        labels = {"host": "spark-b", "class": kind}
        assert count(metrics, "sparkd_host_kernel_events_total", **labels) == n
    # After a reboot the log starts again at low timestamps: every line is new.
    look(metrics, xid13, boot="boot-2")
    assert count(metrics, "sparkd_gpu_xid_total", host="spark-b", xid="13") == 6


def test_an_xid_outside_the_catalogue_is_other() -> None:
    metrics = Metrics(lambda: [])
    line = "[  5.000001] spark-b kernel: NVRM: Xid (PCI:000f:01:00): 1234, pid=1, name=x, y\n"
    look(metrics, line)
    assert count(metrics, "sparkd_gpu_xid_total", host="spark-b", xid="other") == 1
    assert count(metrics, "sparkd_gpu_xid_total", host="spark-b", xid="1234") is None
