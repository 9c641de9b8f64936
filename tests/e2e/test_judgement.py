"""Judgement end to end against the simulated world: the situations where acting would make it
worse, checked in the world's command log."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import asyncssh

from sparkd.model.plan import Action, Plan
from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.daemon import (
    controller,
    converge,
    converged,
    cycle_until,
    eventually,
    mutations,
)
from tests.support.worlds import both_servers


def ray_restarts(world: World, host: str, since: float) -> list[str]:
    return [
        r.command
        for r in mutations(world, host, since)
        if r.command.startswith(("docker run", "docker rm"))
    ]


async def test_ray_unreadable_during_a_progressing_load_is_watched_not_restarted(
    tmp_path: Path, pool: SshPool
) -> None:
    # A load that takes several join timeouts, so a restart of Ray would have had its chance.
    timing = dataclasses.replace(Timing.fast(), model_load=12.0)
    async with World(tmp_path / "world", scenario="seed-morning", timing=timing) as world:
        ctl, since = await converged(world, pool, tmp_path / "state", cycles=200)
        await world.fault("crash-model", "spark-a")
        await cycle_until(ctl, "loading", limit=200)
        hung_at = time.time()
        await world.fault("hang-tool", "spark-a", "ray")
        plans = await cycle_until(ctl, "but the model serves; watching", limit=200)
        assert any("the model's load advances; watching" in p.reason for p in plans)
        assert all(p.actions == () for p in plans), [p.reason for p in plans if p.actions]
        assert ray_restarts(world, "spark-a", hung_at) == []
        assert ray_restarts(world, "spark-b", hung_at) == []
        launches = [r for r in mutations(world, "spark-a", since) if "vllm serve" in r.command]
        assert len(launches) == 1
        await world.fault("heal", "spark-a")
        final = await converge(ctl, cycles=200)
        assert final[-1].phase == "healthy"
        assert ray_restarts(world, "spark-a", hung_at) == []


async def test_a_foreign_gpu_process_is_killed_only_while_nvidia_smi_lists_it(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(
        seed_world, pool, tmp_path / "state", cluster={"policy": {"allow_kill_foreign_gpu": True}}
    )
    await converge(ctl, cycles=200)
    since = time.time()
    said = await seed_world.fault("stray-gpu", "spark-b")
    pid = int(said.split()[3])
    plans = await converge(ctl, cycles=200)
    assert any(a.kind == "kill_gpu_process" for p in plans for a in p.actions)
    kills = [r.command for r in mutations(seed_world, "spark-b", since) if "kill" in r.command]
    assert kills and all(str(pid) in k for k in kills)

    # Hand-made actions the planner never makes: the executor refuses them on its own.
    since = time.time()
    for target, result, detail in (
        ("1", "failed", "refusing"),
        ("0", "failed", "refusing"),
        ("-1", "failed", "refusing"),
        (str(pid), "ok", "no longer holds a GPU"),
    ):
        action = Action(kind="kill_gpu_process", host="spark-b", target=target, reason="t")
        plan = Plan(cluster="sparks", phase="cleaning", reason="t", actions=(action,))
        [outcome] = await ctl.executor.run(plan)
        assert (outcome.result, detail in outcome.detail) == (result, True), outcome
    assert [r for r in mutations(seed_world, "spark-b", since) if "kill" in r.command] == []


async def test_crash_looping_conflicting_container_is_removed_and_hosts_stay_reachable(
    tmp_path: Path, pool: SshPool
) -> None:
    """The seed's morning with `restart=always` GLM containers crash-looping: Docker calls them
    `restarting` and refuses `docker top` on them."""
    async with World(tmp_path / "world", scenario="seed-crashloop", timing=Timing.fast()) as w:
        ctl = controller(w, pool, tmp_path / "state")
        plans = await converge(ctl, cycles=200)
        assert all(p.phase != "unreachable" for p in plans), [p.reason for p in plans]
        removed = [(r.host, r.command) for r in mutations(w) if r.command.startswith("docker rm")]
        assert ("spark-a", "docker rm -f -- glm-flash") in removed
        assert ("spark-b", "docker rm -f -- glm-flash") in removed
        assert plans[-1].phase == "healthy"


async def test_a_restarted_worker_is_waited_for_by_node_id_and_costs_one_launch(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """Real Ray keeps a killed worker's node ALIVE for a while and shows the new one beside it;
    the model is launched once, and never on a view that holds the old node."""
    ctl = controller(seed_world, pool, tmp_path / "state")
    await converge(ctl, cycles=200)
    assert ctl.view.snapshot is not None and ctl.view.snapshot.ray is not None
    worker_ip = ctl.cluster.host("spark-b").ip
    old = {n.node_id for n in ctl.view.snapshot.ray.nodes if n.ip == worker_ip}
    since = time.time()
    await seed_world.fault("kill-container", "spark-b", "sparkd-sparks-ray-worker")
    launches_seen_on: list[set[str]] = []
    for _ in range(300):
        plan = await ctl.cycle()
        seen = ctl.view.snapshot
        assert seen is not None and seen.ray is not None
        if seen.ray.up and old & set(seen.ray.alive_node_ids):
            # Ray still counts the killed node: whatever else, no launch on this view.
            assert not any(a.kind.endswith("_model") for a in plan.actions), plan.reason
        if any(a.kind in ("start_model", "restart_model") for a in plan.actions):
            assert seen.ray is not None
            launches_seen_on.append(set(seen.ray.alive_node_ids))
        if plan.converged and launches_seen_on:
            break
        await asyncio.sleep(ctl.cluster.recheck_interval)
    assert plan.converged, plan.reason
    assert len(launches_seen_on) == 1
    assert not (launches_seen_on[0] & old), "launched on a view holding the dead node"
    launches = [r for r in mutations(seed_world, "spark-a", since) if "vllm serve" in r.command]
    assert len(launches) == 1


async def test_a_stuck_load_with_a_chatty_log_is_restarted_after_load_stall(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl, since = await converged(seed_world, pool, tmp_path / "state", cycles=200)
    await seed_world.fault("chatty-stall", "spark-a")
    await seed_world.fault("crash-model", "spark-a")
    plans = await converge(ctl, cycles=400)
    stalls = [a for p in plans for a in p.actions if "load stalled" in a.reason]
    assert len(stalls) == 1, [p.reason for p in plans if p.actions]
    launches = [r for r in mutations(seed_world, "spark-a", since) if "vllm serve" in r.command]
    assert len(launches) == 2


async def test_each_node_gets_its_data_ip_as_vllm_host_ip_so_the_load_progresses(
    tmp_path: Path, pool: SshPool
) -> None:
    """Hosts whose default route is the management network: without VLLM_HOST_IP per node, the
    older Ray executor (vLLM 0.32.0 with `VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`) would pin its
    placement group to an address Ray does not know and never load; sparkd sets it always."""
    async with World(
        tmp_path / "world", scenario="seed-morning", timing=Timing.fast(), data_network=True
    ) as world:
        ctl = controller(world, pool, tmp_path / "state")
        plans = await converge(ctl, cycles=300)
        assert plans[-1].phase == "healthy"
        runs = [r for r in mutations(world) if r.command.startswith("docker run")]
        for host in ctl.cluster.hosts:
            [run] = [r.command for r in runs if r.host == host.name]
            assert f"VLLM_HOST_IP={host.data_ip}" in run
            assert host.data_ip != host.address


def with_impostor_key(world: World, host: str, path: Path) -> Path:
    """The world's known_hosts, with `host`'s line naming a key the host does not have."""
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    target = world.hosts[host]
    prefix = f"[{target.address}]:{target.port} "
    lines = world.known_hosts_path.read_text().splitlines()
    swapped = [prefix + impostor if line.startswith(prefix) else line for line in lines]
    assert swapped != lines
    path.write_text("\n".join(swapped) + "\n")
    return path


@both_servers
async def test_a_changed_host_key_is_reported_and_nothing_is_sent_to_that_host(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    known_hosts = with_impostor_key(seed_world, "spark-b", tmp_path / "known_hosts")
    state = tmp_path / "state"
    ctl = controller(seed_world, pool, state, cluster={"ssh": {"known_hosts_file": known_hosts}})
    for _ in range(3):
        plan = await ctl.cycle()
        snapshot = ctl.view.snapshot
        assert snapshot is not None
        worker = snapshot.host("spark-b")
        assert worker is not None and worker.error is not None
        assert worker.error.kind == "host_key", worker.error
        assert plan.phase == "unreachable", plan.reason
        assert "spark-b" in plan.reason
    # Not one command reached the host whose key changed: no login, no tool call.
    assert seed_world.commands("spark-b") == []
    assert seed_world.commands("spark-a"), "the head was read all along"
    # The head's own work goes on; what the operator must fix is in the event log.
    [phase] = [e for e in ctl.state.read_events_counted(50, "sparks")[0] if e["kind"] == "phase"]
    assert phase["phase"] == "unreachable"
    assert "spark-b (worker) unreachable (host_key: " in phase["reason"]


@both_servers
async def test_a_hung_remote_tool_is_ended_on_the_host_and_the_daemon_reads_on(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """A wedged `nvidia-smi`: `timeout` ends it on the host each cycle, the rest of the fact
    script arrives, the connection goes on serving, and nothing is restarted for it."""
    world = healthy_world
    ctl = controller(world, pool, tmp_path / "state")
    # The world launches its own model just after it starts; only sparkd's commands count.
    await eventually(lambda: bool(mutations(world)), within=10)
    await converge(ctl)
    since = time.time()
    await world.fault("hang-tool", "spark-a", "nvidia-smi")
    for _ in range(2):
        plan = await ctl.cycle()
        assert plan.actions == (), plan.reason
        snapshot = ctl.view.snapshot
        assert snapshot is not None
        head = snapshot.host("spark-a")
        assert head is not None and head.reachable, head
        assert {c.name for c in head.containers} == {"sparkd-sparks-ray-head"}
    assert len(world.hung_calls) >= 2
    await eventually(lambda: all(call.released for call in world.hung_calls), within=3)
    await world.fault("heal", "spark-a")
    final = await converge(ctl)
    assert final[-1].phase == "healthy"
    sent = [r for r in world.commands("spark-a") if r.source == "ssh" and r.at >= since]
    assert len(sent) >= 3  # a fact script a cycle, over the same host all along
    assert mutations(world, since=since) == []
