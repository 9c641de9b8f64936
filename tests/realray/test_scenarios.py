"""sparkd end to end against real Ray 2.60: what the simulator's model of Ray cannot prove (that
sparkd reads Ray's real output right, that a launch really gets the GPUs it needs, that a
restarted node really rejoins). One world and one daemon for the module, scenario after
scenario, each from and back to `healthy` (so the order matters); then a launch by hand with the
worker gone, and a stop that must leave nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
from pathlib import Path

import pytest

from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.shell import catalogue
from sparkd_sim.world import World
from tests.realray.conftest import RealCluster
from tests.support.daemon import converge as converge_every
from tests.support.daemon import mutations

pytestmark = [pytest.mark.realray, pytest.mark.asyncio(loop_scope="module")]

HEAD = "sparkd-sparks-ray-head"
WORKER = "sparkd-sparks-ray-worker"
NODE_ID = re.compile(r"^[0-9a-f]{56}$")


def kinds(plans: list[Plan]) -> list[str]:
    return [a.kind for p in plans for a in p.actions]


async def converge(ctl: Controller, cycles: int = 150) -> list[Plan]:
    """Cycle at the recheck interval until converged; every plan on the way."""
    return await converge_every(ctl, cycles, ctl.cluster.recheck_interval)


async def settled(ctl: Controller, cycles: int = 60) -> None:
    """Healthy for longer than `policy.healthy_reset`, so the next fault is an incident of its
    own with its own restart budget, as faults apart in time are."""
    since: float | None = None
    for _ in range(cycles):
        plan = await ctl.cycle()
        if plan.phase != "healthy":
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since > ctl.cluster.policy.healthy_reset:
            return
        await asyncio.sleep(ctl.cluster.recheck_interval)
    raise AssertionError(f"not settled healthy after {cycles} cycles: {plan.reason}")


async def repaired(ctl: Controller, cycles: int = 150) -> list[Plan]:
    """After a fault: cycle until sparkd acts on it, then until converged again."""
    plans = []
    for _ in range(cycles):
        plan = await ctl.cycle()
        plans.append(plan)
        if plan.actions:
            return plans + await converge(ctl, cycles)
        await asyncio.sleep(ctl.cluster.recheck_interval)
    raise AssertionError(f"no repair after {cycles} cycles: {plans[-1].reason}")


async def repair_of(
    real_cluster: RealCluster, name: str, host: str, arg: str
) -> tuple[list[tuple[str, str]], float]:
    """From settled, through the fault, back to healthy: the (kind, host) of every action, and
    the wall-clock time before the fault (what was launched since is the repair's)."""
    world, ctl = real_cluster.world, real_cluster.controller
    await settled(ctl)
    since = time.time()
    await world.fault(name, host, arg)
    plans = await repaired(ctl)
    assert plans[-1].phase == "healthy", plans[-1].reason
    return [(a.kind, a.host) for p in plans for a in p.actions], since


def launches(world: World, since: float) -> list[str]:
    return [r.command for r in mutations(world, "spark-a", since) if "vllm serve" in r.command]


def _in_namespaces(spaces: set[str]) -> list[int]:
    """Processes whose PID namespace is one of `spaces` (by namespace, not PID: PIDs get
    reused)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") in spaces:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _private_tmpfs(pid: int) -> set[str]:
    """Mount points of tmpfs file systems in the mount namespace of `pid`."""
    found = set()
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype == "tmpfs":
            found.add(fields[4])
    return found


def alive_nodes(ctl: Controller) -> dict[str, str]:
    """node id -> IP, as sparkd last read them from the real `ray list nodes`."""
    snapshot = ctl.view.snapshot
    assert snapshot is not None and snapshot.ray is not None
    return {n.node_id: n.ip for n in snapshot.ray.nodes if n.alive}


async def test_cold_start_from_seed_morning(real_cluster: RealCluster) -> None:
    world, ctl = real_cluster.world, real_cluster.controller
    plans = await converge(ctl)
    assert kinds(plans) == ["stop_unit"] * 4 + ["remove_container"] * 2 + [
        "start_ray_head",
        "start_ray_worker",
        "start_model",
    ]
    assert plans[-1].phase == "healthy"
    assert all(o.result == "ok" for o in ctl.view.recent)
    # What sparkd read came from Ray itself: real node ids, one per host's data IP.
    nodes = alive_nodes(ctl)
    assert all(NODE_ID.match(n) for n in nodes)
    assert sorted(nodes.values()) == sorted(h.ip for h in ctl.cluster.hosts)
    # Read from the real dashboard's HTTP API, by the head's own GETs (no channel to the
    # dashboard's port): never `ray list nodes`, and `ray status` only while the dashboard did
    # not answer yet (it starts a second or so after the GCS).
    calls = [r.command for r in world.commands(ctl.cluster.head.name)]
    assert not [c for c in calls if c.startswith("ray list")], calls
    port = ctl.cluster.ray.dashboard_port
    gets = [c for c in calls if c.startswith("python3 -I -S -c")]
    assert any(f" 127.0.0.1 {port} /api/v0/nodes?" in c for c in gets), calls
    assert sum(c.startswith("ray status") for c in calls) < len(plans) // 2, calls
    assert len(launches(world, 0.0)) == 1
    # The model holds one GPU on each node, through a real placement group.
    [serve] = world.serves
    assert {c.name for _, c, _, _ in serve.workers} == {HEAD, WORKER}


async def test_killed_worker_is_waited_for_by_node_id_and_costs_one_launch(
    real_cluster: RealCluster,
) -> None:
    world, ctl = real_cluster.world, real_cluster.controller
    await settled(ctl)
    worker_ip = ctl.cluster.host("spark-b").ip
    old = {n for n, ip in alive_nodes(ctl).items() if ip == worker_ip}
    since = time.time()
    await world.fault("kill-container", "spark-b", WORKER)
    launched_on: list[set[str]] = []
    plans = []
    for _ in range(150):
        plan = await ctl.cycle()
        plans.append(plan)
        seen = set(alive_nodes(ctl)) if ctl.view.snapshot and ctl.view.snapshot.ray else set()
        if any(a.kind in ("start_model", "restart_model") for a in plan.actions):
            launched_on.append(seen)
        if plan.converged and launched_on:
            break
        await asyncio.sleep(ctl.cluster.recheck_interval)
    assert plans[-1].converged and plans[-1].phase == "healthy", plans[-1].reason
    assert kinds(plans).count("start_ray_worker") + kinds(plans).count("restart_ray") == 1
    assert len(launched_on) == 1 and not (launched_on[0] & old), "launched on the dead node"
    assert len(launches(world, since)) == 1
    new = {n for n, ip in alive_nodes(ctl).items() if ip == worker_ip}
    assert len(new) == 1 and not (new & old)


async def test_hung_worker_is_detected_and_repaired(real_cluster: RealCluster) -> None:
    world = real_cluster.world
    done, since = await repair_of(real_cluster, "hang-container", "spark-b", WORKER)
    assert ("restart_ray", "spark-b") in done or ("start_ray_worker", "spark-b") in done
    assert not any(host == "spark-a" and "ray" in kind for kind, host in done)
    assert len(launches(world, since)) == 1
    await world.fault("heal", "spark-b")


async def test_worker_on_the_wrong_ip_is_restarted(real_cluster: RealCluster) -> None:
    world, ctl = real_cluster.world, real_cluster.controller
    await settled(ctl)
    await world.fault("wrong-ip", "spark-b")
    wrong = world.hosts["spark-b"].state.ray_ip_override
    await world.fault("kill-container", "spark-b", WORKER)
    plans = []
    for _ in range(150):
        plan = await ctl.cycle()
        plans.append(plan)
        if any("not a configured data IP" in a.reason for a in plan.actions):
            break
        await asyncio.sleep(ctl.cluster.recheck_interval)
    [wrong_interface] = [a for a in plans[-1].actions if "not a configured data IP" in a.reason]
    assert wrong_interface.kind == "restart_ray" and wrong_interface.host == "spark-b"
    assert f"registered on {wrong}" in wrong_interface.reason
    await world.fault("heal", "spark-b")
    plans = await converge(ctl)
    assert plans[-1].phase == "healthy"
    ips = sorted(alive_nodes(ctl).values())
    assert ips == sorted(h.ip for h in ctl.cluster.hosts)
    assert wrong is not None and wrong not in ips


async def test_head_restart_restarts_the_workers(real_cluster: RealCluster) -> None:
    world = real_cluster.world
    done, since = await repair_of(real_cluster, "kill-container", "spark-a", HEAD)
    assert ("start_ray_head", "spark-a") in done and ("restart_ray", "spark-b") in done
    assert done.index(("start_ray_head", "spark-a")) <= done.index(("restart_ray", "spark-b"))
    assert len(launches(world, since)) == 1


async def test_a_launch_with_a_node_missing_waits_for_it_and_serves_once_it_rejoins(
    real_cluster: RealCluster,
) -> None:
    """A launch that raced the worker's death (sparkd's own start command, sent by hand once Ray
    has dropped the killed worker's GPU) does not exit: like vLLM 0.32 it warns and waits for its
    placement group. The daemon starts the worker again, the group goes to the new node, and that
    launch serves: no relaunch, no stop."""
    world, ctl = real_cluster.world, real_cluster.controller
    await settled(ctl)
    head = world.hosts["spark-a"]
    container = head.state.container(HEAD)
    assert container is not None and world.real_ray is not None
    await world.fault("kill-container", "spark-b", WORKER)
    for _ in range(60):
        status = await world.real_ray.cli(container, ["status"])
        if " 0.0/1.0 GPU" in status.stdout:
            break
        await asyncio.sleep(ctl.cluster.recheck_interval)
    assert " 0.0/1.0 GPU" in status.stdout, status.stdout
    cluster = ctl.cluster
    for _ in range(60):  # the serve the worker's death ended
        if not world.serves:
            break
        await asyncio.sleep(ctl.cluster.recheck_interval)
    seconds = cluster.ssh.command_timeout
    launch = catalogue.actions.start_model(cluster, seconds)
    rc, _, err = await head.ssh.run_local(launch.command)
    assert rc == 0, err
    short = "exceeds the total number of available GPUs in the placement group"
    read_log = f"cat {head.state.log_dir}/serve.log"
    for _ in range(60):
        _, said, _ = await head.ssh.run_local(read_log)
        if short in said:
            break
        await asyncio.sleep(ctl.cluster.recheck_interval)
    assert short in said, said[-2000:]
    assert world.serves, "vLLM waits for its placement group; it has not exited"
    since = time.time()
    plans = await converge(ctl)
    assert plans[-1].phase == "healthy", plans[-1].reason
    assert kinds(plans) == ["start_ray_worker"], [p.reason for p in plans if p.actions]
    assert launches(world, since) == []
    assert not [r for r in mutations(world, "spark-a", since) if "kill" in r.command]


async def test_stopping_the_world_leaves_no_ray_behind(real_cluster: RealCluster) -> None:
    world = real_cluster.world
    assert world.real_ray is not None
    # Every node started in this module, the killed and restarted ones too, each held by a
    # handle of our own past the stop: the kernel gives a freed namespace's number to the next
    # one made on the machine, and a look by a name no handle holds may count a stranger's.
    with contextlib.ExitStack() as held:
        for handle in world.real_ray.pid_namespaces.values():
            held.callback(os.close, os.dup(handle))
        spaces = set(world.real_ray.pid_namespaces)
        assert spaces and len(_in_namespaces(spaces)) > 4  # gcs, raylet, dashboard...
        # What Ray writes to /tmp/ray and /dev/shm lands on tmpfs mounts of each node's own mount
        # namespace, which end with it (the machine's /dev/shm is anyone's to use: not checked).
        inits = [n.init for n in world.real_ray.namespaces.values()]
        assert inits
        for init in inits:
            assert os.readlink(f"/proc/{init}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
            assert _private_tmpfs(init) >= {"/tmp/ray", "/dev/shm"}
        ports = sorted(world.real_ray.ports)
        assert world.real_ray.gcs_port in ports
        addresses = {"127.0.0.1"} | {h.state.address for h in world.hosts.values()}
        addresses |= {h.state.data_ip for h in world.hosts.values()}
        await world.stop()
        assert _in_namespaces(spaces) == []
        # A listener on a node's address or on the wildcard would refuse these binds.
        for address in sorted(addresses):
            for port in ports:
                with socket.socket() as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind((address, port))
