"""`sparkd_power_cycles_total{cluster,host,result}`: each power cycle the executor ran, by result,
exported at 0 for every host before the first."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sparkd.model.plan import Action, ActionOutcome
from sparkd.runtime.cluster_view import CycleRecord
from sparkd.runtime.metrics import Metrics
from tests.toy import reference_cluster


def outcome(kind: str, host: str, result: str) -> ActionOutcome:
    action = Action.model_validate({"kind": kind, "host": host, "target": host, "reason": "r"})
    return ActionOutcome.model_validate(
        {"action": action, "result": result, "started_at": 1.0, "finished_at": 2.0}
    )


def count(metrics: Metrics, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(
        "sparkd_power_cycles_total", {"cluster": "sparks", **labels}
    )


def test_power_cycles_are_counted_by_host_and_result() -> None:
    cluster = reference_cluster()
    metrics = Metrics(lambda: [])
    metrics.track(cluster)
    for host in ("spark-a", "spark-b"):
        for result in ("ok", "failed", "timeout"):
            assert count(metrics, host=host, result=result) == 0
    controller: Any = SimpleNamespace(cluster=cluster)
    outcomes = (
        outcome("power_cycle", "spark-b", "ok"),
        outcome("power_cycle", "spark-a", "timeout"),
        outcome("restart_model", "spark-a", "ok"),
    )
    metrics.record(controller, CycleRecord(ok=True, seconds=0.1, outcomes=outcomes))
    assert count(metrics, host="spark-b", result="ok") == 1
    assert count(metrics, host="spark-a", result="timeout") == 1
    assert count(metrics, host="spark-a", result="ok") == 0
    labels = {"cluster": "sparks", "action": "power_cycle", "result": "ok"}
    assert metrics.registry.get_sample_value("sparkd_remediations_total", labels) == 1
