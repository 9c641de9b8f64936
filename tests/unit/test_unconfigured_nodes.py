"""A Ray node on no configured host's address (a machine someone joined to the cluster by hand,
`ray start --address=HEAD:6379` on a laptop) changes what Ray lists, not the model's actors on
the configured hosts: a serving cluster is not restarted for it coming or going
(docs/decisions.md, `restart_model` and `restart_ray`). A configured host whose node rejoined
with a new id still is."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import remember
from sparkd.model.observed import Observed, RayNode
from tests.support.planning import COMMON, healthy
from tests.toy import Toy

DESTRUCTIVE = {"restart_model", "restart_ray", "start_ray_head", "start_ray_worker"}
# Addresses of no configured host (documentation ranges, RFC 5737): never contacted.
STRANGERS = ("192.0.2.10", "198.51.100.7", "203.0.113.99")


def stranger(index: int, gpus: float) -> RayNode:
    return RayNode(node_id=f"{index:x}" * 56, ip=STRANGERS[index % 3], alive=True, gpus=gpus)


def with_nodes(seen: Observed, extra: tuple[RayNode, ...]) -> Observed:
    ray = seen.ray
    assert ray is not None
    nodes = (*ray.nodes, *extra)
    update = {"nodes": nodes, "gpus_total": sum(n.gpus for n in nodes if n.alive)}
    return seen.model_copy(update={"ray": ray.model_copy(update=update)})


def test_an_unconfigured_node_joining_a_serving_cluster_restarts_nothing() -> None:
    toy, memory = healthy()
    for _ in range(4):
        toy.advance(60.0)
        seen = with_nodes(toy.observe(), (stranger(1, 1.0),))
        made = plan(toy.cluster, seen, memory, toy.now)
        assert {a.kind for a in made.actions} & DESTRUCTIVE == set(), made.reason
        assert made.phase == "healthy", made.reason
        memory = remember(memory, seen, [], toy.now, made)


def test_a_configured_host_that_rejoined_with_a_new_id_still_restarts_the_model() -> None:
    toy, memory = healthy()
    worker = toy.cluster.workers[0]
    toy.advance(60.0)
    seen = toy.observe()
    ray = seen.ray
    assert ray is not None
    nodes = tuple(
        n.model_copy(update={"node_id": "a" * 56}) if n.ip == worker.data_ip else n
        for n in ray.nodes
    )
    seen = seen.model_copy(update={"ray": ray.model_copy(update={"nodes": nodes})})
    made = plan(toy.cluster, seen, memory, toy.now)
    assert [a.kind for a in made.actions] == ["restart_model"], made.reason
    assert f"a node rejoined with a new id): {worker.name}'s node" in made.reason


@COMMON
@given(st.lists(st.sets(st.sampled_from([(0, 1.0), (1, 0.0), (2, 1.0)])), min_size=1, max_size=8))
def test_unconfigured_nodes_coming_and_going_never_restart_a_serving_cluster(
    steps: list[set[tuple[int, float]]],
) -> None:
    """Property: whichever unconfigured nodes Ray lists at each look (joined before the launch
    or after, leaving, with GPUs or none), a serving cluster is neither restarted nor rejoined."""
    toy: Toy
    toy, memory = healthy()
    for present in steps:
        toy.advance(60.0)
        extra = tuple(stranger(i, gpus) for i, gpus in sorted(present))
        seen = with_nodes(toy.observe(), extra)
        made = plan(toy.cluster, seen, memory, toy.now)
        assert {a.kind for a in made.actions} & DESTRUCTIVE == set(), made.reason
        memory = remember(memory, seen, [], toy.now, made)
