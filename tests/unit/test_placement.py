"""The serve's placement group, from its log (core.reading.placement), and what it changes in the
judgement of a Ray node that joined after the launch: vLLM 0.32.0 (`v1/executor/ray_utils.py`)
waits up to 1800 s for its group when the cluster is short of GPUs, so a launch that raced a lost
node is waiting, not running on the node it lost."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import parsers
from sparkd.core.reading.placement import parse_placement
from sparkd.core.remembering.remember import remember
from sparkd.core.text import printable
from sparkd.model.observed import Observed, Placement
from tests.support.planning import COMMON, healthy

FIXTURES = Path(__file__).parent.parent / "fixtures"
# Real vLLM 0.32.0 + Ray 2.60.0 output (tests/fixtures/vllm-ray-executor/README.md).
REAL = (FIXTURES / "vllm-ray-executor" / "serve.log").read_bytes().decode()
PLACED_ON = (
    "6af31de3ea1d071b9f4312736be8d04358baeb675b920044210791e1",
    "1aebe9edd9124e839c63ba38ef5211fcabe5ac85dd13b1e135859422",
)
# A real launch made while Ray had one node of two, the worker's joining after vLLM's first wait
# line: `initialize_ray_cluster` (607, 613), `_wait_until_pg_ready` at 10 s (logged as 467),
# then `_verify_bundles` (321) for each node (tests/fixtures/vllm-ray-executor/README.md).
WAIT_RUN = (FIXTURES / "vllm-ray-executor" / "placement-wait.log").read_text().splitlines()
CREATING, SHORT, WAITING = WAIT_RUN[:3]
OTHER = "(APIServer pid=213) INFO 12-07 06:18:41 [model.py:547] Resolved architecture: Qwen3"


def in_node(node: str) -> str:
    return (
        "(EngineCore pid=231) WARNING 12-07 06:18:55 [ray_utils.py:321] tensor_parallel_size=2 is "
        f"bigger than a reserved number of GPUs (1 GPUs) in a node {node}. Tensor parallel "
        "workers can be spread out to 2+ nodes which can degrade the performance unless you have "
        "fast interconnect across nodes, like Infiniband."
    )


def test_the_real_log_names_the_nodes_the_group_went_to() -> None:
    for text in (REAL, printable(REAL, lines=True)):
        placement = parse_placement(parsers.log_lines(text))
        assert placement == Placement(stage="placed", nodes=PLACED_ON)


def test_the_real_log_up_to_the_groups_creation_is_waiting() -> None:
    lines = parsers.log_lines(REAL)
    upto = next(i for i, line in enumerate(lines) if "No current placement group" in line)
    assert parse_placement(lines[: upto + 1]) == Placement(stage="waiting")


def test_the_real_wait_reads_waiting_then_placed_on_both_nodes() -> None:
    assert "Waiting for creating a placement group" in WAITING
    assert parse_placement(WAIT_RUN[:3]) == Placement(stage="waiting")
    placed = parse_placement(WAIT_RUN)
    assert placed is not None and placed.stage == "placed" and len(set(placed.nodes)) == 2


def test_a_short_cluster_is_a_wait_not_a_failure() -> None:
    assert parse_placement([OTHER, CREATING, SHORT, WAITING]) == Placement(stage="waiting")
    placed = parse_placement([CREATING, SHORT, WAITING, in_node("b" * 56)])
    assert placed == Placement(stage="placed", nodes=("b" * 56,))
    assert parse_placement([OTHER]) is None
    assert parse_placement([]) is None


LINES = {"creating": CREATING, "short": SHORT, "waiting": WAITING, "other": OTHER}


@COMMON
@given(
    st.lists(st.sampled_from(["creating", "short", "waiting", "other", "node", "worker"])),
    st.lists(st.sampled_from(["a" * 56, "b" * 56, "c" * 56]), min_size=1),
)
def test_placement_is_what_the_lines_say_in_any_order(kinds: list[str], ids: list[str]) -> None:
    """Property: placed (with exactly the nodes named, in order, once each) as soon as a node or
    a worker's line shows the group ready; waiting when only the wait's lines are there; None
    when nothing speaks of a group."""
    lines, named = [], []
    for index, kind in enumerate(kinds):
        if kind == "node":
            node = ids[index % len(ids)]
            lines.append(in_node(node))
            named.append(node)
        elif kind == "worker":
            lines.append(f"\x1b[36m(RayWorkerProc pid={index + 90})\x1b[0m INFO loading")
        else:
            lines.append(LINES[kind])
    got = parse_placement(lines)
    if "node" in kinds or "worker" in kinds:
        assert got == Placement(stage="placed", nodes=tuple(dict.fromkeys(named)))
    elif {"creating", "short", "waiting"} & set(kinds):
        assert got == Placement(stage="waiting")
    else:
        assert got is None


def rejoined(seen: Observed, host_ip: str, new_id: str, placement: Placement | None) -> Observed:
    """`seen` with the node on `host_ip` rejoined as `new_id` and the serve's placement."""
    ray, serve = seen.ray, seen.serve
    assert ray is not None and serve is not None
    nodes = tuple(
        n.model_copy(update={"node_id": new_id}) if n.ip == host_ip else n for n in ray.nodes
    )
    return seen.model_copy(
        update={
            "ray": ray.model_copy(update={"nodes": nodes}),
            "serve": serve.model_copy(update={"placement": placement}),
        }
    )


def test_a_node_joining_a_launch_that_waits_for_its_group_restarts_nothing() -> None:
    toy, memory = healthy()
    worker = toy.cluster.workers[0]
    toy.advance(60.0)
    new = "d" * 56
    waiting = rejoined(toy.observe(), worker.data_ip, new, Placement(stage="waiting"))
    made = plan(toy.cluster, waiting, memory, toy.now)
    assert "restart_model" not in [a.kind for a in made.actions], made.reason
    # Placed on the new node (the group went there when it joined): the actors are there.
    ray = waiting.ray
    assert ray is not None
    on = Placement(stage="placed", nodes=tuple(n.node_id for n in ray.nodes))
    made = plan(toy.cluster, rejoined(toy.observe(), worker.data_ip, new, on), memory, toy.now)
    assert "restart_model" not in [a.kind for a in made.actions], made.reason
    # Placed on the node before it rejoined: its actors are gone with it.
    before = toy.observe().ray
    assert before is not None
    old = Placement(stage="placed", nodes=tuple(n.node_id for n in before.nodes))
    made = plan(toy.cluster, rejoined(toy.observe(), worker.data_ip, new, old), memory, toy.now)
    assert [a.kind for a in made.actions] == ["restart_model"], made.reason


@COMMON
@given(
    st.sampled_from(["waiting", "placed_here", "placed_before", "unsaid"]),
    st.sampled_from(["d" * 56, "e" * 56]),
    st.floats(min_value=1.0, max_value=3600.0),
)
def test_a_rejoined_node_restarts_the_model_only_if_the_model_ran_on_the_one_it_replaced(
    said: str, new: str, after: float
) -> None:
    """Property: whatever the new id and whenever it shows, the model is restarted for a rejoined
    node exactly when the model's group was on the node it replaced: placed there by the log's
    word, or (the log silent) by the nodes Ray listed at the launch."""
    toy, memory = healthy()
    worker = toy.cluster.workers[0]
    toy.advance(after)
    before = toy.observe().ray
    assert before is not None
    old_ids = tuple(n.node_id for n in before.nodes)
    new_ids = tuple(new if n.ip == worker.data_ip else n.node_id for n in before.nodes)
    placement = {
        "waiting": Placement(stage="waiting"),
        "placed_here": Placement(stage="placed", nodes=new_ids),
        "placed_before": Placement(stage="placed", nodes=old_ids),
        "unsaid": None,
    }[said]
    made = plan(
        toy.cluster, rejoined(toy.observe(), worker.data_ip, new, placement), memory, toy.now
    )
    restarted = "restart_model" in [a.kind for a in made.actions]
    assert restarted == (said in ("placed_before", "unsaid")), (said, made.reason)


def test_memory_learns_where_the_group_went_so_a_scrolled_log_restarts_nothing() -> None:
    """The raced launch: sparkd recorded the nodes Ray listed at the launch, the worker's old id
    among them. Once the log names where the group went, memory keeps that; when those lines have
    scrolled out of the tail, a serving model is not restarted for the node it never lost."""
    toy, memory = healthy()
    worker = toy.cluster.workers[0]
    new = "d" * 56
    toy.advance(60.0)
    listed = toy.observe().ray
    assert listed is not None
    went = tuple(new if n.ip == worker.data_ip else n.node_id for n in listed.nodes)
    placed = rejoined(toy.observe(), worker.data_ip, new, Placement(stage="placed", nodes=went))
    made = plan(toy.cluster, placed, memory, toy.now)
    assert made.actions == (), made.reason
    memory = remember(memory, placed, [], toy.now, made)
    assert set(memory.launch_nodes) == set(went)
    toy.advance(3600.0)
    scrolled = rejoined(toy.observe(), worker.data_ip, new, None)
    made = plan(toy.cluster, scrolled, memory, toy.now)
    assert "restart_model" not in [a.kind for a in made.actions], made.reason
