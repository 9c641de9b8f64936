"""A launch that raced a lost node: vLLM 0.32 waits for its placement group (up to 1800 s) when
the cluster has fewer GPUs than it asks for (`v1/executor/ray_utils.py`, `initialize_ray_cluster`
lines 608-618, `_wait_until_pg_ready`), so the node's return, not a relaunch, is the repair."""

from __future__ import annotations

import time
from pathlib import Path

from sparkd.shell import catalogue
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import converge, converged, eventually, mutations

WORKER = "sparkd-sparks-ray-worker"


async def test_a_launch_waiting_for_a_lost_node_loads_once_ray_restarts_the_node(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    world = seed_world
    ctl, _ = await converged(world, pool, tmp_path / "state", cycles=200)
    await world.fault("kill-container", "spark-b", WORKER)
    await eventually(lambda: not world.serves, within=30)
    # The launch a look made just before the worker's exit showed: sparkd's own command.
    cluster = ctl.cluster
    seconds = cluster.ssh.command_timeout
    launch = catalogue.actions.start_model(cluster, seconds)
    await pool.connection(cluster.head, cluster.ssh).run(launch.command, timeout=seconds)
    await eventually(lambda: bool(world.serves), within=30)
    waiting = world.serves[0]
    since = time.time()
    plans = await converge(ctl, cycles=300)
    assert plans[-1].phase == "healthy", plans[-1].reason
    acted = [(a.kind, a.host) for p in plans for a in p.actions]
    assert acted == [("start_ray_worker", "spark-b")], acted
    # The process that waited for its placement group is the one that serves.
    assert world.serves == [waiting], world.serves
    # The waiting launch is the one that serves: nothing stopped it, nothing launched again.
    after = [r.command for r in mutations(world, "spark-a", since)]
    assert not [c for c in after if "vllm serve" in c or "kill" in c], after
