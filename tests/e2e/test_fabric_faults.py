"""Fabric faults against the simulated world over SSH: what the sysfs files say reaches the plan
(the hold, its reason) and the metrics."""

from __future__ import annotations

import time
from pathlib import Path

from sparkd.runtime.controller import Controller
from sparkd.runtime.metrics import Metrics
from sparkd.settings import load_settings
from sparkd.shell.ssh import SshPool
from sparkd_sim import fake_fabric
from sparkd_sim.world import World
from tests.support.daemon import controller, converge, cycle_until, cycles, mutations


def watched(world: World, pool: SshPool, state: Path) -> tuple[Controller, Metrics]:
    """A controller whose cycles feed a metrics registry, as the daemon's do."""
    found: list[Controller] = []
    metrics = Metrics(lambda: found)
    ctl = controller(world, pool, state, on_record=metrics.record)
    found.append(ctl)
    metrics.track(ctl.cluster)
    return ctl, metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"cluster": "sparks", **labels})


def launches(world: World, since: float) -> list[str]:
    return [r.command for r in mutations(world, "spark-a", since) if "vllm serve" in r.command]


async def test_a_moved_gid_is_reported_and_its_flap_holds_the_relaunch(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, metrics = watched(healthy_world, pool, tmp_path / "state")
    await converge(ctl, cycles=100)
    assert sample(metrics, "sparkd_fabric_gid_index", host="spark-b") == 3
    await healthy_world.fault("gid-moved", "spark-b")
    plans = await cycle_until(
        ctl,
        "fabric: spark-b enp1s0f0np0: the data IP's RoCE v2 GID moved from index 3 to 5 after "
        "the model launched (NCCL keeps the old one)",
    )
    assert plans[-1].phase == "degraded" and plans[-1].triage == ("fabric",)
    # The link drop that moved it is a flap, visible for fabric.flap_window.
    assert "fabric: spark-b enp1s0f0np0 flapped (carrier changed)" in plans[-1].reason
    assert sample(metrics, "sparkd_fabric_gid_index", host="spark-b") == 5
    assert sample(metrics, "sparkd_fabric_gid_index", host="spark-a") == 3
    assert sample(metrics, "sparkd_fabric_flaps_total", host="spark-b") == 1
    assert sample(metrics, "sparkd_cluster_triage", **{"class": "fabric"}) == 1
    # The model dies: no relaunch over the fabric while the flap holds (NCCL would open on a
    # link that just dropped), then one relaunch, on the new row.
    since = time.time()
    started = time.monotonic()
    await healthy_world.fault("crash-model", "spark-a")
    plans = await cycle_until(ctl, "starting_model")
    plans += await cycles(ctl, 5)
    # The flap's hold is its own note: the start it vetoes waits, no budget spent.
    assert all("fabric: spark-b enp1s0f0np0 flapped" in p.reason for p in plans), plans[-1].reason
    assert not [a for p in plans for a in p.actions if a.kind == "start_model"]
    assert launches(healthy_world, since) == []
    final = await converge(ctl, cycles=600)
    assert time.monotonic() - started < ctl.cluster.fabric.flap_window + 60
    assert final[-1].phase == "healthy" and final[-1].triage == ()
    assert len(launches(healthy_world, since)) == 1
    assert sample(metrics, "sparkd_cluster_triage", **{"class": "fabric"}) == 0


def docker_runs(world: World, host: str, since: float) -> list[str]:
    return [r.command for r in mutations(world, host, since) if r.command.startswith("docker run")]


async def test_a_model_hung_over_a_faulty_fabric_restarts_both_ranks_once_it_is_sound(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, metrics = watched(healthy_world, pool, tmp_path / "state")
    await converge(ctl, cycles=100)
    since = time.time()
    # The firmware reset spark-b's MTU: tensor-parallel NCCL hangs without an error.
    await healthy_world.fault("mtu-mismatch", "spark-b")
    # The counter standing under load is the verdict every run reaches (daemon time); once it
    # stands no probe is sent (runtime.reads.probe_due), so whether the probe count reached
    # failure_threshold first depends on how many looks fit the hang_window. At the defaults
    # it never does: the window, one probe interval, closes by the look due the third probe.
    plans = await cycle_until(ctl, "hung under load: ", limit=300)
    assert "fabric: MTU mismatch on the data link (spark-a 9000, spark-b 1500)" in plans[-1].reason
    assert plans[-1].phase == "blocked" and plans[-1].triage == ("fabric",)
    assert plans[-1].actions == ()
    # Held: no restart over the faulty fabric (it would hang again), no budget spent.
    assert mutations(healthy_world, since=since) == []
    healed = time.time()
    await healthy_world.fault("heal", "spark-b")
    plans = await cycle_until(ctl, "fabric sound again after a hold of")
    assert [(a.kind, a.host) for a in plans[-1].actions] == [
        ("restart_ray", "spark-a"),
        ("restart_ray", "spark-b"),
    ]
    final = await converge(ctl, cycles=400)
    assert final[-1].phase == "healthy" and final[-1].triage == ()
    assert len(docker_runs(healthy_world, "spark-a", healed)) == 1
    assert len(docker_runs(healthy_world, "spark-b", healed)) == 1
    assert len(launches(healthy_world, healed)) == 1
    labels = {"action": "restart_ray", "result": "ok"}
    assert sample(metrics, "sparkd_remediations_total", **labels) == 2
    assert sample(metrics, "sparkd_remediations_total", action="restart_model", result="ok") == 0


async def test_the_other_half_of_the_port_down_holds_the_relaunch(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """A Spark's QSFP port is two RDMA devices; NCCL_IB_HCA lists both, as recipes set it. The
    data interface's half stays sound while the other goes DOWN: sparkd sees it, names it, and
    relaunches nothing over it until it is back."""
    env = {**load_settings(healthy_world.config_path).clusters[0].ray.env}
    env["NCCL_IB_HCA"] = f"{fake_fabric.RDMA_DEVICE},{fake_fabric.RAIL_DEVICE}"
    found: list[Controller] = []
    metrics = Metrics(lambda: found)
    ctl = controller(
        healthy_world,
        pool,
        tmp_path / "state",
        on_record=metrics.record,
        cluster={"ray": {"env": env}},
    )
    found.append(ctl)
    metrics.track(ctl.cluster)
    final = await converge(ctl, cycles=100)
    assert final[-1].phase == "healthy" and final[-1].triage == ()
    await healthy_world.fault("rail-down", "spark-b")
    down = f"fabric: spark-b {fake_fabric.RAIL_DEVICE} port 1 (in NCCL_IB_HCA) is DOWN (Disabled)"
    plans = await cycle_until(ctl, down)
    assert plans[-1].phase == "blocked" and plans[-1].triage == ("fabric",)
    assert sample(metrics, "sparkd_cluster_triage", **{"class": "fabric"}) == 1
    since = time.time()
    await healthy_world.fault("crash-model", "spark-a")
    plans = await cycles(ctl, 8)
    assert all(down in p.reason for p in plans), plans[-1].reason
    assert not [a for p in plans for a in p.actions if a.kind == "start_model"]
    assert launches(healthy_world, since) == []
    await healthy_world.fault("heal", "spark-b")
    final = await converge(ctl, cycles=400)
    assert final[-1].phase == "healthy" and final[-1].triage == ()
    assert len(launches(healthy_world, since)) == 1
