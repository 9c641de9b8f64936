"""Both halves of a DGX Spark's QSFP port: every RDMA device `NCCL_IB_HCA` lists is read and
judged (fixtures in tests/fixtures/fabric, sources in its SOURCES.md)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import links
from sparkd.model.cluster import ClusterSpec
from sparkd.model.hca import Hca, parse_hca
from sparkd.model.observed import Fabric
from sparkd.model.spec import RaySpec
from sparkd.shell import catalogue
from tests.examples import EXAMPLE_SET
from tests.support.planning import STARTS, host, kinds

FABRIC = Path(__file__).resolve().parent.parent / "fixtures" / "fabric"
HEAD_IP = "192.168.200.12"


def read(name: str, ip: str = HEAD_IP) -> Fabric:
    return links.parse_fabric((FABRIC / name).read_text(), ip)


def playbook_hca() -> str:
    """`NCCL_IB_HCA` as recipes build it: every Up device of NVIDIA's real `ibdev2netdev`."""
    lines = (FABRIC / "ibdev2netdev-connect-two-sparks.txt").read_text().splitlines()
    return ",".join(sorted(line.split()[0] for line in lines if line.endswith("(Up)")))


def test_the_playbooks_two_halves_are_the_two_rails_read() -> None:
    assert playbook_hca() == "roceP2p1s0f1,rocep1s0f1"
    sound = read("two-rails.txt")
    # The data device is judged by the data IP; the other half is a rail of its own.
    assert (sound.rdma_device, sound.port_state, sound.gid_index) == ("rocep1s0f1", "ACTIVE", 3)
    assert [(r.device, r.port, r.port_state, r.rate_gbps, r.roce_v2_gids) for r in sound.rails] == [
        ("roceP2p1s0f1", 1, "ACTIVE", 200.0, (3,))
    ]
    down = read("second-rail-down.txt").rails[0]
    assert (down.port_state, down.phys_state, down.rate_gbps, down.roce_v2_gids) == (
        "DOWN",
        "Disabled",
        40.0,
        (),
    )
    assert read("second-rail-no-gid.txt").rails[0].roce_v2_gids == ()


def test_nccls_syntax() -> None:
    assert parse_hca("rocep1s0f1,roceP2p1s0f1") == Hca(
        (("rocep1s0f1", None), ("roceP2p1s0f1", None)), exact=False, exclude=False
    )
    assert parse_hca("=rocep1s0f1:1") == Hca((("rocep1s0f1", 1),), exact=True, exclude=False)
    assert parse_hca("^=mlx5_1,mlx5_4") == Hca(
        (("mlx5_1", None), ("mlx5_4", None)), exact=True, exclude=True
    )
    for bad in ("roce;reboot", "rocep1s0f1:x", "$(id)", "a b", "roce*"):
        with pytest.raises(ValueError, match="NCCL_IB_HCA"):
            parse_hca(bad)


def cluster_with(value: str) -> ClusterSpec:
    toy, _ = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    env = {**toy.cluster.ray.env, "NCCL_IB_HCA": value}
    return toy.cluster.model_copy(update={"ray": toy.cluster.ray.model_copy(update={"env": env})})


def test_the_fact_script_reads_every_listed_device_quoted() -> None:
    assert catalogue.reads.rail_globs(cluster_with(playbook_hca())) == (
        "/sys/class/infiniband/roceP2p1s0f1*/ports/*",
        "/sys/class/infiniband/rocep1s0f1*/ports/*",
    )
    assert catalogue.reads.rail_globs(cluster_with("=rocep1s0f1:1")) == (
        "/sys/class/infiniband/rocep1s0f1/ports/1",
    )
    # An excluding list names what NCCL avoids: only the data interface's device is read.
    assert catalogue.reads.rail_globs(cluster_with("^rocep1s0f0")) == ()
    cluster = cluster_with("=rocep1s0f1,roceP2p1s0f1")
    section = catalogue.reads.fabric_section(cluster.head, 5, catalogue.reads.rail_globs(cluster))
    words = shlex.split(section)
    assert "/sys/class/infiniband/roceP2p1s0f1/ports/*/state" in words
    assert "/sys/class/infiniband/roceP2p1s0f1/ports/*/gid_attrs/types/*" in words
    script = "\n".join(r.command for r in catalogue.reads.fact_scripts(cluster, cluster.head))
    assert "/sys/class/infiniband/roceP2p1s0f1/ports/*/rate" in script


def test_the_config_refuses_an_unsafe_device_name() -> None:
    with pytest.raises(ValueError, match="not a device name"):
        RaySpec(image="vllm", env={"NCCL_IB_HCA": "rocep1s0f1,$(reboot)"})
    assert RaySpec(image="vllm", env={"NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1"})


def test_a_sound_second_rail_changes_no_plan() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    observed = toy.observe()
    for h in toy.cluster.hosts:
        observed = host(observed, h.name, fabric=read("two-rails.txt"))
    before = plan(toy.cluster, toy.observe(), memory, toy.now)
    after = plan(toy.cluster, observed, memory, toy.now)
    assert (after.phase, after.actions, after.triage) == (before.phase, before.actions, ())


def test_a_second_rail_down_holds_every_start_naming_the_device() -> None:
    """Today's failure: the data half is sound, so the other half's DOWN port went unseen and
    the model was restarted onto a fabric NCCL hangs on."""
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    observed = host(toy.observe(), "spark-a", fabric=read("two-rails.txt"))
    observed = host(observed, "spark-b", fabric=read("second-rail-down.txt"))
    result = plan(toy.cluster, observed, memory, toy.now)
    assert not kinds(result) & STARTS
    assert result.phase == "blocked" and result.triage == ("fabric",)
    assert (
        "fabric: spark-b roceP2p1s0f1 port 1 (in NCCL_IB_HCA) is DOWN (Disabled)" in result.reason
    )


def test_a_second_rail_without_an_address_or_at_another_index_blocks() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    observed = host(toy.observe(), "spark-b", fabric=read("second-rail-no-gid.txt"))
    result = plan(toy.cluster, observed, memory, toy.now)
    assert not kinds(result) & STARTS and result.phase == "blocked"
    assert "roceP2p1s0f1 port 1 (in NCCL_IB_HCA) has no routable RoCE v2 GID" in result.reason
    cluster = cluster_with("rocep1s0f1,roceP2p1s0f1")
    env = {**cluster.ray.env, "NCCL_IB_GID_INDEX": "5"}
    cluster = cluster.model_copy(update={"ray": cluster.ray.model_copy(update={"env": env})})
    sound = read("two-rails.txt")
    data = sound.model_copy(update={"gid_index": 5})
    observed = host(toy.observe(), "spark-b", fabric=data)
    result = plan(cluster, observed, memory, toy.now)
    assert "holds RoCE v2 at GID index 3, not NCCL_IB_GID_INDEX=5" in result.reason


def test_a_slow_second_rail_is_degraded_when_a_rate_is_expected() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "healthy-reasoning-only").build()
    sound = read("two-rails.txt")
    slow = sound.model_copy(
        update={"rails": (sound.rails[0].model_copy(update={"rate_gbps": 100.0}),)}
    )
    cluster = toy.cluster.model_copy(
        update={"fabric": toy.cluster.fabric.model_copy(update={"expected_rate_gbps": 200.0})}
    )
    result = plan(cluster, host(toy.observe(), "spark-b", fabric=slow), memory, toy.now)
    assert result.phase == "degraded" and result.triage == ("fabric",)
    assert "roceP2p1s0f1 port 1 (in NCCL_IB_HCA) runs at 100 Gb/s, below the expected 200" in (
        result.reason
    )
