"""Ray's autoscaler v2 (`RAY_enable_autoscaler_v2=1` in `ray.env`): the dashboard's cluster
status has no report for ever (real Ray 2.60: tests/fixtures/ray-http/V2_head_start.jsonl).
Read as 0 usable GPUs, it held the cluster in "Ray settling" for ever; the formatted status
counts them, and the model starts."""

from __future__ import annotations

from pathlib import Path

from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.daemon import controller, converge
from tests.support.live import cluster_of


async def test_a_cluster_under_autoscaler_v2_converges(tmp_path: Path, pool: SshPool) -> None:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        env = {**cluster_of(world).ray.env, "RAY_enable_autoscaler_v2": "1"}
        ctl = controller(world, pool, tmp_path / "state", cluster={"ray": {"env": env}})
        plans = await converge(ctl, cycles=300)
        assert plans[-1].phase == "healthy", plans[-1].reason
        alive = [c for c in world.ray.clusters if c.alive]
        assert alive and all(c.autoscaler_v2 for c in alive)
