"""The data link's RDMA fabric: sysfs parsing (tests/fixtures/fabric) and the fabric triage."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import links
from sparkd.core.remembering.remember import remember
from sparkd.model.observed import Fabric
from tests.examples import EXAMPLE_SET
from tests.support.planning import COMMON, SOUND, STARTS, Placed, host, kinds, situations_at_a_host

FABRIC = Path(__file__).resolve().parent.parent / "fixtures" / "fabric"
HEAD_IP = "192.168.200.12"


def read(name: str, ip: str = HEAD_IP) -> Fabric:
    return links.parse_fabric((FABRIC / name).read_text(), ip)


def test_a_sound_port() -> None:
    assert read("healthy.txt") == SOUND


def test_the_gid_row_follows_the_address_and_its_type() -> None:
    assert read("gid-moved.txt").gid_index == 5
    # Another address: no row of its own.
    assert read("healthy.txt", "192.168.200.13").gid_index is None


def test_a_port_down_and_no_rdma_device() -> None:
    down = read("port-down.txt")
    assert (down.port_state, down.phys_state, down.rate_gbps, down.gid_index) == (
        "DOWN",
        "Disabled",
        40.0,
        None,
    )
    assert read("no-rdma.txt") == Fabric(mtu=1500, carrier_changes=1)


@given(st.text(), st.text(max_size=40))
def test_the_parser_is_total(text: str, ip: str) -> None:
    assert isinstance(links.parse_fabric(text, ip), Fabric)


def test_a_sound_fabric_changes_no_plan() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "load-stalled").build()
    sound = read("healthy.txt")
    observed = toy.observe()
    for h in toy.cluster.hosts:
        observed = host(observed, h.name, fabric=sound)
    before = plan(toy.cluster, toy.observe(), memory, toy.now)
    after = plan(toy.cluster, observed, memory, toy.now)
    assert (after.phase, after.actions, after.triage) == (before.phase, before.actions, ())


def test_an_mtu_mismatch_holds_the_restart_and_names_the_fix() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "load-stalled").build()
    observed = host(toy.observe(), "spark-a", fabric=read("healthy.txt"))
    observed = host(
        observed, "spark-b", fabric=read("healthy.txt").model_copy(update={"mtu": 1500})
    )
    result = plan(toy.cluster, observed, memory, toy.now)
    assert "restart_model" not in kinds(result)
    assert result.phase == "blocked" and result.triage == ("fabric",)
    assert (
        "fabric: MTU mismatch on the data link (spark-a 9000, spark-b 1500): set the MTU of "
        "enp1s0f0np0 on spark-b to 9000" in result.reason
    )


def test_a_gid_index_other_than_nccls_holds_ray_and_the_model() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    env = {**toy.cluster.ray.env, "NCCL_IB_GID_INDEX": "3"}
    cluster = toy.cluster.model_copy(
        update={"ray": toy.cluster.ray.model_copy(update={"env": env})}
    )
    moved = read("gid-moved.txt")
    observed = host(toy.observe(), "spark-a", fabric=moved)
    result = plan(cluster, observed, memory, toy.now)
    assert not kinds(result) & STARTS
    assert "at GID index 5, not NCCL_IB_GID_INDEX=3" in result.reason
    assert result.phase == "blocked"


def test_a_port_down_or_a_missing_gid_blocks() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    result = plan(
        toy.cluster, host(toy.observe(), "spark-b", fabric=read("port-down.txt")), memory, toy.now
    )
    assert "restart_model" not in kinds(result) and result.phase == "blocked"
    assert "spark-b enp1s0f0np0 (rocep1s0f0 port 1) is DOWN (Disabled)" in result.reason
    lost = read("healthy.txt", "10.0.0.1")
    result = plan(toy.cluster, host(toy.observe(), "spark-a", fabric=lost), memory, toy.now)
    assert "has no RoCE v2 GID for" in result.reason and result.phase == "blocked"


def test_a_slow_link_is_degraded_when_a_rate_is_expected() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "healthy-reasoning-only").build()
    slow = read("healthy.txt").model_copy(update={"rate_gbps": 25.0})
    observed = host(toy.observe(), "spark-b", fabric=slow)
    assert plan(toy.cluster, observed, memory, toy.now).triage == ()
    cluster = toy.cluster.model_copy(
        update={"fabric": toy.cluster.fabric.model_copy(update={"expected_rate_gbps": 200.0})}
    )
    result = plan(cluster, observed, memory, toy.now)
    assert result.phase == "degraded" and result.triage == ("fabric",)
    assert "runs at 25 Gb/s, below the expected 200" in result.reason


def test_a_flap_stays_visible_for_the_window_then_clears() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "healthy-reasoning-only").build()
    first = host(toy.observe(), "spark-b", fabric=read("healthy.txt"))
    memory = remember(memory, first, (), toy.now)
    flapped = host(
        toy.observe(),
        "spark-b",
        fabric=read("healthy.txt").model_copy(update={"carrier_changes": 4}),
    )
    memory = remember(memory, flapped, (), toy.now)
    assert memory.flapped_at == {"spark-b": flapped.observed_at}
    result = plan(toy.cluster, flapped, memory, flapped.observed_at + 60)
    assert "spark-b enp1s0f0np0 flapped" in result.reason and result.triage == ("fabric",)
    later = plan(
        toy.cluster, flapped, memory, flapped.observed_at + toy.cluster.fabric.flap_window + 1
    )
    assert later.triage == ()


@COMMON
@given(situations_at_a_host(), st.data())
def test_a_hard_fabric_fault_anywhere_starts_nothing(s: Placed, data: st.DataObject) -> None:
    toy, memory, now, name = s
    sample = data.draw(st.sampled_from(["port-down.txt", "no-rdma.txt"]))
    observed = toy.observe()
    for h in toy.cluster.hosts:
        observed = host(observed, h.name, fabric=read("healthy.txt", h.ip))
    observed = host(observed, name, fabric=read(sample, toy.cluster.host(name).ip))
    result = plan(toy.cluster, observed, memory, now)  # type: ignore[arg-type]
    assert not kinds(result) & STARTS
    assert "fabric" in result.triage


def test_a_gid_moved_after_the_launch_is_reported_and_holds_nothing() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    assert memory.launched_at is not None
    first = host(toy.observe(), "spark-a", fabric=read("healthy.txt"))
    memory = remember(memory, first, (), toy.now)
    # The flap that came with it is its own finding (and holds restarts for its window).
    quiet = read("gid-moved.txt").model_copy(update={"carrier_changes": 2})
    moved = host(toy.observe(), "spark-a", fabric=quiet)
    memory = remember(memory, moved, (), toy.now)
    assert memory.gid_moved == {"spark-a": (3, 5, moved.observed_at)}
    result = plan(toy.cluster, moved, memory, toy.now)
    assert "the data IP's RoCE v2 GID moved from index 3 to 5 after the model launched" in (
        result.reason
    )
    # The relaunch is what opens NCCL on the new index: the restart goes ahead.
    assert "restart_model" in kinds(result) and result.triage == ("fabric",)
    relaunched = memory.model_copy(update={"launched_at": moved.observed_at + 1})
    assert "GID moved" not in plan(toy.cluster, moved, relaunched, toy.now).reason


def test_a_gid_moved_under_a_model_sparkd_did_not_launch_is_reported_too() -> None:
    """No launched_at (the model was running when sparkd first looked, or memory was lost):
    the serve process's own age says it opened NCCL before the move."""
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    memory = memory.evolve(launched_at=None)
    first = host(toy.observe(), "spark-a", fabric=read("healthy.txt"))
    memory = remember(memory, first, (), toy.now)
    quiet = read("gid-moved.txt").model_copy(update={"carrier_changes": 2})
    moved = host(toy.observe(), "spark-a", fabric=quiet)
    memory = remember(memory, moved, (), toy.now)
    assert memory.launched_at is None
    result = plan(toy.cluster, moved, memory, toy.now)
    assert "the data IP's RoCE v2 GID moved from index 3 to 5 after the model launched" in (
        result.reason
    )
