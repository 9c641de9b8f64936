"""The controller's read policy (runtime.reads): when a look may take Ray's last reading instead
of a `ray` call, and when it probes the model."""

from __future__ import annotations

from sparkd.core.deciding.planner import plan
from sparkd.model.memory import Memory
from sparkd.model.plan import Plan
from sparkd.runtime.cluster_view import ClusterView
from sparkd.runtime.reads import probe_due, reusable_ray
from tests.toy import Toy


def converged_view(toy: Toy) -> ClusterView:
    seen = toy.observe()
    made = plan(toy.cluster, seen, Memory(), toy.now)
    view = ClusterView(snapshot=seen, plan=made)
    assert made.converged, made.reason
    return view


def reuse(view: ClusterView, toy: Toy, *, stirred: bool = False, read_ago: float = 1.0) -> bool:
    found = reusable_ray(
        view,
        stirred=stirred,
        read_at=toy.now - read_ago,
        now=toy.now,
        probe_interval=toy.cluster.probe_interval,
    )
    assert found is None or (view.snapshot is not None and found is view.snapshot.ray)
    return found is not None


def test_a_converged_unstirred_cluster_read_lately_reuses_ray() -> None:
    toy = Toy.healthy()
    assert reuse(converged_view(toy), toy)


def test_an_event_or_an_operator_means_ray_is_read_again() -> None:
    toy = Toy.healthy()
    assert not reuse(converged_view(toy), toy, stirred=True)


def test_a_failed_cycle_means_ray_is_read_again() -> None:
    toy = Toy.healthy()
    view = converged_view(toy)
    view.last_error = "OSError: boom"
    assert not reuse(view, toy)


def test_ray_is_read_at_least_once_a_probe_interval() -> None:
    toy = Toy.healthy()
    assert not reuse(converged_view(toy), toy, read_ago=toy.cluster.probe_interval)


def test_a_cluster_not_converged_reads_ray() -> None:
    toy = Toy.healthy()
    view = converged_view(toy)
    view.plan = Plan(cluster=toy.cluster.name, phase="loading", reason="loading")
    assert not reuse(view, toy)
    assert not reuse(ClusterView(), toy)


def test_the_first_probe_of_a_launch_goes_once_the_model_answers_then_every_interval() -> None:
    toy = Toy.healthy()
    seen = toy.observe()
    endpoint = seen.endpoint
    assert endpoint is not None and endpoint.status == "up"
    assert probe_due(toy.cluster, Memory(), endpoint, toy.now)
    probed = Memory(last_probe=seen.probe, last_probe_at=toy.now - 1.0)
    assert seen.probe is not None
    assert not probe_due(toy.cluster, probed, endpoint, toy.now)
    interval = toy.cluster.probe_interval
    assert probe_due(toy.cluster, probed, endpoint, toy.now - 1.0 + interval)
