"""Rollouts end to end: a config change reaches the simulated world as one cutover; a new spec
that fails there is rolled back to the last-good one, which serves again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from sparkd.core import rollout
from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool
from sparkd.sim.world import World
from tests.e2e.conftest import FAST_EXECUTOR, controller, converge, mutations

BAD_FLAG = "--enable-resoning"


def serves(world: World, since: float) -> list[str]:
    """The `vllm serve` command lines run on the head since `since`."""
    return [r.command for r in mutations(world, "spark-a", since) if "vllm serve" in r.command]


async def last_good(ctl: Controller) -> None:
    """Cycle until the serving spec is last-good (its acceptance probes answered)."""
    for _ in range(100):
        await ctl.cycle()
        if ctl.memory.last_good is not None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("no last-good spec recorded")


def reloaded(ctl: Controller, state: Path, **model: Any) -> Controller:
    """The controller a config reload makes: the new spec, the memory on disk."""
    cluster = ctl.cluster
    spec = cluster.model_copy(update={"model": cluster.model.model_copy(update=model)})
    return Controller(spec, ctl.pool, StateDir(state), executor_timing=FAST_EXECUTOR)


async def until(ctl: Controller, done: Any, cycles: int = 300) -> list[Plan]:
    plans: list[Plan] = []
    for _ in range(cycles):
        plans.append(await ctl.cycle())
        if done(plans[-1], ctl):
            return plans
        await asyncio.sleep(0.1)
    raise AssertionError(f"not done after {cycles} cycles: {plans[-1].reason}")


def rolled_back_and_serving(plan: Plan, ctl: Controller) -> bool:
    record = ctl.memory.rollout
    return plan.phase == "degraded" and record is not None and record.restored_at is not None


async def serving_with_last_good(world: World, pool: SshPool, state: Path) -> Controller:
    ctl = controller(world, pool, state)
    await converge(ctl)
    await last_good(ctl)
    return ctl


def assert_rolled_back(ctl: Controller, plans: list[Plan], bad: str, good: str, why: str) -> None:
    started = next(p for p in plans if p.rollback is not None)
    assert why in (started.rollback or "")
    held = plans[-1]
    assert held.reason.startswith(f"rolled back from {bad} to {good}: "), held.reason
    record = ctl.memory.rollout
    assert record is not None and record.result == "rolled_back"
    events = ctl.state.read_events(1000, ctl.cluster.name)
    back = [e for e in events if e["kind"] == "rolled_back"]
    assert len(back) == 1 and why in back[0]["reason"] and back[0]["last_good"] == good


async def test_a_good_change_rolls_out_with_one_cutover_and_is_accepted(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    state = tmp_path / "s"
    old = await serving_with_last_good(healthy_world, pool, state)
    good = old.memory.last_good
    assert good is not None
    since = time.time()
    args = (*old.cluster.model.extra_args, "--max-num-seqs", "8")
    ctl = reloaded(old, state, extra_args=args)
    plans = await until(
        ctl, lambda p, c: c.memory.rollout is not None and c.memory.rollout.result == "accepted"
    )
    launched = serves(healthy_world, since)
    assert len(launched) == 1 and "--max-num-seqs 8" in launched[0]
    assert not any(p.rollback for p in plans)
    record = ctl.memory.rollout
    assert record is not None and record.from_hash == good.hash
    assert record.downtime is not None and record.downtime > 0
    new_good = ctl.memory.last_good
    assert new_good is not None and new_good.hash == rollout.identity(ctl.cluster)


async def test_a_bad_argument_rolls_back_and_serves_again(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    state = tmp_path / "s"
    old = await serving_with_last_good(healthy_world, pool, state)
    good = old.memory.last_good
    assert good is not None
    since = time.time()
    ctl = reloaded(old, state, extra_args=(*old.cluster.model.extra_args, BAD_FLAG))
    plans = await until(ctl, rolled_back_and_serving)
    bad = rollout.identity(ctl.cluster)
    assert_rolled_back(ctl, plans, bad, good.hash, f"unrecognized arguments: {BAD_FLAG}")
    launched = serves(healthy_world, since)
    assert [BAD_FLAG in c for c in launched] == [True, False]
    # Held: the bad spec is not tried again.
    for _ in range(5):
        assert not (await ctl.cycle()).actions
        await asyncio.sleep(0.1)
    assert len(serves(healthy_world, since)) == 2
