"""Invariant 6, blame follows evidence with any number of hosts: a Ray node on a foreign address
is the host's whose management address it is, and a host still joining is left to join."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.spec import container_name
from sparkd.model.memory import Memory
from sparkd.model.observed import RayNode
from sparkd.model.plan import Action
from tests.support.planning import cluster_of
from tests.toy import Toy

COMMON = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def joining(draw: st.DrawFn) -> tuple[Toy, Memory, set[str], set[str]]:
    """A healthy cluster of 3-5 hosts whose workers restarted at random times: some have
    joined, some not; one may have registered on its management address, or on an address
    nobody has. Returns the toy, the memory, the hosts still inside join_timeout, and the host
    whose management address carries a node."""
    count = draw(st.integers(3, 5))
    toy = Toy.healthy(cluster_of(count))
    cluster = toy.cluster
    join = cluster.ray.join_timeout
    workers = [h for h in cluster.hosts if h.role == "worker"]
    missing = draw(st.sets(st.sampled_from([w.name for w in workers]), min_size=1))
    young: set[str] = set()
    for worker in workers:
        if worker.name not in missing:
            continue
        age = draw(st.floats(1, join * 3))
        if age <= join:
            young.add(worker.name)
        name = container_name(cluster, worker)
        box = toy.containers[worker.name][name]
        toy.containers[worker.name][name] = box.model_copy(update={"started_at": toy.now - age})
        toy.ray_nodes = [n for n in toy.ray_nodes if n.ip != worker.ip]
    owned: set[str] = set()
    stranger = draw(st.sampled_from(["none", "management", "unknown"]))
    if stranger == "management":
        culprit = cluster.host(draw(st.sampled_from(sorted(missing))))
        owned.add(culprit.name)
        toy.ray_nodes.append(RayNode(node_id="nodeff", ip=culprit.address, alive=True, gpus=1.0))
    elif stranger == "unknown":
        toy.ray_nodes.append(RayNode(node_id="nodefe", ip="172.17.0.2", alive=True, gpus=1.0))
    memory = Memory(
        launched_at=toy.serve_started,
        model_ready_at=toy.now - 100,
        ray_seen={n.node_id: toy.now - 3000 for n in toy.ray_nodes},
    )
    return toy, memory, young, owned


def _restarted(actions: tuple[Action, ...]) -> set[str]:
    return {a.host for a in actions if a.kind == "restart_ray"}


@COMMON
@given(joining())
def test_a_stranger_node_blames_only_the_host_it_belongs_to(
    s: tuple[Toy, Memory, set[str], set[str]],
) -> None:
    toy, memory, young, owned = s
    result = plan(toy.cluster, toy.observe(), memory, toy.now)
    restarted = _restarted(result.actions)
    # A worker still inside join_timeout, with no node of its own on a wrong address, is
    # joining: it is never restarted (unless a new head makes every worker rejoin).
    if toy.cluster.head.name not in restarted:
        assert not (restarted & (young - owned)), result.reason
    assert owned <= restarted, result.reason


def test_one_stranger_with_two_missing_workers_blames_neither_while_they_join() -> None:
    toy = Toy.healthy(cluster_of(3))
    cluster = toy.cluster
    for worker in cluster.workers:
        name = container_name(cluster, worker)
        box = toy.containers[worker.name][name]
        toy.containers[worker.name][name] = box.model_copy(update={"started_at": toy.now - 20})
    toy.ray_nodes = [n for n in toy.ray_nodes if n.is_head]
    toy.ray_nodes.append(RayNode(node_id="nodefe", ip="172.17.0.2", alive=True, gpus=1.0))
    result = plan(cluster, toy.observe(), Memory(launched_at=toy.serve_started), toy.now)
    assert _restarted(result.actions) == set()
    assert "Ray node on spark-b joining" in result.reason
    assert "Ray node on spark-c joining" in result.reason


def test_a_node_on_a_management_address_is_that_hosts() -> None:
    toy = Toy.healthy(cluster_of(3))
    cluster = toy.cluster
    c = cluster.host("spark-c")
    toy.ray_nodes = [
        n for n in toy.ray_nodes if n.ip != c.ip and n.ip != cluster.host("spark-b").ip
    ]
    toy.ray_nodes.append(RayNode(node_id="nodeff", ip=c.address, alive=True, gpus=1.0))
    for worker in cluster.workers:
        name = container_name(cluster, worker)
        box = toy.containers[worker.name][name]
        toy.containers[worker.name][name] = box.model_copy(update={"started_at": toy.now - 20})
    result = plan(cluster, toy.observe(), Memory(launched_at=toy.serve_started), toy.now)
    assert [(a.kind, a.host) for a in result.actions] == [("restart_ray", "spark-c")]
    assert c.address in result.actions[0].reason
