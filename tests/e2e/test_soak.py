"""Randomized fault soak: the daemon against a stream of faults, checking its invariants.

Marked `soak`; SPARKD_SOAK_COUNT sets how many seeded runs (CI runs a small count) and
SPARKD_SOAK_FAULTS how many faults each run injects.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.shell.ssh import SshPool
from sparkd.sim.timing import Timing
from sparkd.sim.world import World
from tests.e2e.conftest import controller

COUNT = int(os.environ.get("SPARKD_SOAK_COUNT", "2"))
FAULTS = int(os.environ.get("SPARKD_SOAK_FAULTS", "4"))
# (fault, host role, argument); each heals by itself or by sparkd's remediation.
CHOICES = (
    ("crash-model", "head", None),
    ("reboot", "worker", None),
    ("reboot", "head", None),
    ("kill-container", "worker", "sparkd-sparks-ray-worker"),
    ("kill-container", "head", "sparkd-sparks-ray-head"),
    ("oom-capture+crash-model", "head", None),
    ("stall-load+crash-model", "head", None),
)


async def cycle_checked(ctl: Controller, world: World) -> Plan:
    plan = await ctl.cycle()
    # Invariants, every cycle: never two serve processes, never a name conflict, and no
    # remediation beyond its budget.
    assert len([s for s in world.serves if s.phase != "exited"]) <= 1
    for outcome in ctl.view.recent:
        assert "Conflict" not in outcome.detail, outcome
    return plan


async def until_converged(ctl: Controller, world: World, cycles: int = 300) -> list[Plan]:
    plans = []
    for _ in range(cycles):
        plan = await cycle_checked(ctl, world)
        plans.append(plan)
        assert plan.phase != "blocked", plan.reason
        if plan.converged:
            return plans
        await asyncio.sleep(0.05)
    raise AssertionError(f"not converged: {plans[-1].reason}")


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(COUNT))
async def test_soak(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    pool = SshPool(reconnect_initial=0.05, reconnect_max=0.2)
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        ctl = controller(world, pool, tmp_path / "state", cluster={"policy": {"budget": 50}})
        try:
            await until_converged(ctl, world)
            for _ in range(FAULTS):
                fault, role, arg = rng.choice(CHOICES)
                host = "spark-a" if role == "head" else "spark-b"
                for name in fault.split("+"):
                    await world.fault(name, host, arg)
                await asyncio.sleep(rng.uniform(0, 0.5))
                plans = await until_converged(ctl, world)
                assert plans[-1].phase == "healthy"
                # Dependency order held in every plan: no model start before Ray was whole.
                for plan in plans:
                    kinds = [a.kind for a in plan.actions]
                    if "start_model" in kinds or "restart_model" in kinds:
                        assert not {"start_ray_head", "start_ray_worker"} & set(kinds)
        finally:
            await pool.close()
