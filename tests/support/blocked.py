"""A cluster held by what it cannot mend: nothing done while the cause holds, and healthy again
once the world's remedy (an operator's reboot, a heal) is applied."""

from __future__ import annotations

from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd_sim.world import World
from tests.support.daemon import converge, cycle_until, cycles, mutations


async def relaunch_held(
    world: World, ctl: Controller, since: float, done: str, more: int
) -> list[Plan]:
    """Crash the model on the head, so that only a relaunch would mend it; cycle until a plan
    holds `done` (as `cycle_until`), then `more` cycles: the plans on the way, none of which
    acted, the last one blocked, and no host changed since `since`."""
    await world.fault("crash-model", "spark-a")
    plans = await cycle_until(ctl, done)
    plans += await cycles(ctl, more)
    assert all(p.actions == () for p in plans), [p.reason for p in plans if p.actions]
    assert plans[-1].phase == "blocked", plans[-1].reason
    assert mutations(world, since=since) == []
    return plans


async def healthy_after(
    world: World, ctl: Controller, remedy: str, host: str, arg: str | None = None, *, limit: int
) -> list[Plan]:
    """Apply the world's `remedy` (a fault, as `World.fault` takes it), then cycle until converged
    (within `limit` cycles) on a healthy cluster: the plans on the way."""
    await world.fault(remedy, host, arg)
    final = await converge(ctl, cycles=limit)
    assert final[-1].phase == "healthy", final[-1].reason
    return final
