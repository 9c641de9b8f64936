"""A Ray image without `ray` (NVIDIA's vLLM image from 26.05): the container exits 127 at once.
sparkd says what the container printed when it starts it again, and once it has failed the same
way twice it is `blocked` with that line, not restarted every cycle."""

from __future__ import annotations

import time
from pathlib import Path

from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.daemon import converged, cycle_until, cycles, mutations

# What the simulated image's entrypoint prints (bash's words for an `exec` of a missing
# command; tests/fixtures/docker-real/no-ray.jsonl has a real shell's, through an entrypoint).
NOT_FOUND = "/opt/nvidia/nvidia_entrypoint.sh: line 67: exec: ray: not found"


async def test_an_image_without_ray_is_blocked_with_what_its_container_said(
    tmp_path: Path, pool: SshPool
) -> None:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        ctl, _ = await converged(world, pool, tmp_path / "state", cycles=200)
        pulled = time.time()
        for host in ("spark-a", "spark-b"):
            await world.fault("image-without-ray", host)
        plans = await cycle_until(ctl, "blocked", limit=300)

        # Started again once with the reason said, not blind.
        starts = [a for p in plans for a in p.actions if a.kind == "start_ray_head"]
        assert starts, [p.reason for p in plans]
        assert all(a.reason == f"Ray head container exited 127: {NOT_FOUND}" for a in starts)
        final = plans[-1]
        assert NOT_FOUND in final.reason and "has `ray`" in final.reason, final.reason
        # And then left alone: no more containers made on a host while it stays so.
        runs = len([r for r in mutations(world, "spark-a", pulled) if "docker run" in r.command])
        later = await cycles(ctl, 20, pause=0.05)
        assert all(p.phase == "blocked" and not p.actions for p in later), later[-1].reason
        again = [r for r in mutations(world, "spark-a", pulled) if "docker run" in r.command]
        assert len(again) == runs <= 3
