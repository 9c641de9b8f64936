"""Randomized fault soak at the shipped budget: per injected fault, count false remediations
(an action the fault does not call for, or more model launches than it costs) and missed faults
(not repaired, or latched `blocked`). Both must be 0; the counts are printed.

Marked `soak`; SPARKD_SOAK_COUNT sets how many seeded runs (CI runs a small count) and
SPARKD_SOAK_FAULTS how many faults each run injects. Faults are separated by sustained health
(`healthy_reset`), so each is its own incident, as the budget counts them.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkd.model.plan import ActionOutcome, Plan
from sparkd.runtime.controller import Controller
from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.e2e.conftest import controller

COUNT = int(os.environ.get("SPARKD_SOAK_COUNT", "2"))
FAULTS = int(os.environ.get("SPARKD_SOAK_FAULTS", "3"))
MODEL_LAUNCHES = frozenset({"start_model", "restart_model"})
CLEANUP = frozenset({"remove_container", "stop_unit"})


@dataclass(frozen=True)
class Fault:
    """A fault, where it strikes, and what repairing it may take."""

    name: str
    role: str
    arg: str | None
    allowed: frozenset[tuple[str, str]]  # (action kind, host role)
    launches: int = 1
    # A fault that does not end by itself lasts this long (nothing may be done meanwhile),
    # then the host is healed.
    lasts: float = 0.0
    # A fault only a human fixes: sparkd must wait it out doing nothing it forbids; then the
    # soak applies this fault on the same host as the human's fix (`heal`, `reboot`).
    fixed_by: str | None = None


HEAD_RAY = frozenset({("start_ray_head", "head"), ("restart_ray", "worker")})
WORKER_RAY = frozenset({("start_ray_worker", "worker"), ("restart_ray", "worker")})
AFTER_REBOOT = frozenset((k, r) for k in CLEANUP for r in ("head", "worker"))
CHOICES = (
    Fault("crash-model", "head", None, frozenset()),
    Fault("reboot", "worker", None, WORKER_RAY | AFTER_REBOOT),
    Fault("reboot", "head", None, HEAD_RAY | WORKER_RAY | AFTER_REBOOT),
    Fault("kill-container", "worker", "sparkd-sparks-ray-worker", WORKER_RAY),
    Fault("kill-container", "head", "sparkd-sparks-ray-head", HEAD_RAY | WORKER_RAY),
    Fault("oom-capture+crash-model", "head", None, frozenset(), launches=2),
    Fault("stall-load+crash-model", "head", None, frozenset(), launches=2),
    Fault("hand-restart-serve", "head", None, frozenset(), launches=0),
    Fault("docker-down", "head", None, frozenset(), launches=0, lasts=3.0),
    Fault("docker-hung", "worker", None, frozenset(), launches=0, lasts=3.0),
    Fault("rename-iface", "worker", None, frozenset(), launches=0, lasts=2.0),
    Fault("hang-capture+crash-model", "head", None, frozenset(), launches=2),
    Fault("orphan-engine", "head", None, frozenset({("restart_ray", "head"), *HEAD_RAY})),
    # A hung vLLM's API server outlives SIGTERM and its engine a SIGKILL: Ray's restart ends it.
    Fault(
        "hang-under-load",
        "head",
        None,
        frozenset({("restart_ray", "head"), *HEAD_RAY}),
        launches=2,
    ),
    Fault("full-disk+crash-model", "head", None, frozenset(), fixed_by="heal"),
    Fault("lost-gpu", "worker", None, WORKER_RAY | AFTER_REBOOT, fixed_by="reboot"),
    # The ops box's wall clock steps (NTP, an RTC wrong at boot, `date -s`): nothing to do.
    Fault("clock-step", "head", None, frozenset(), launches=0),
)
# While a fault only a human fixes stands: looks long enough for any wrong action to show.
WAIT_CYCLES = 25
# How far a clock step goes, either way.
CLOCK_STEP = 7200.0


class SteppedClock:
    def __init__(self) -> None:
        self.step = 0.0

    def __call__(self) -> float:
        return time.time() + self.step


@dataclass
class Tally:
    false_remediations: int = 0
    missed: int = 0


def judge(fault: Fault, outcomes: list[ActionOutcome], roles: dict[str, str]) -> list[str]:
    """What sparkd did for one fault that the fault did not call for."""
    wrong = []
    launches = 0
    for outcome in outcomes:
        action = outcome.action
        if action.kind in MODEL_LAUNCHES:
            launches += 1
            continue
        if (action.kind, roles[action.host]) not in fault.allowed:
            wrong.append(f"{action.kind} on {action.host}: {action.reason}")
    if launches > fault.launches:
        wrong.append(f"{launches} model launches for one {fault.name}")
    return wrong


def collect(into: list[ActionOutcome]) -> Callable[[Controller, ActionOutcome], None]:
    return lambda _, outcome: into.append(outcome)


def describe(outcomes: list[ActionOutcome]) -> list[str]:
    return [
        f"{o.action.kind}@{o.action.host}={o.result} ({o.action.reason}; {o.detail})"
        for o in outcomes
    ]


async def until_healthy_for(
    ctl: Controller, seconds: float, outcomes: list[ActionOutcome], limit: float = 60.0
) -> Plan | None:
    """Cycle until the cluster stayed healthy for `seconds`; None if it never got there."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    healthy_since: float | None = None
    ctl.on_action = lambda _, outcome: outcomes.append(outcome)
    while loop.time() < deadline:
        plan = await ctl.cycle()
        if plan.phase == "blocked":
            return None
        if plan.converged:
            healthy_since = healthy_since or loop.time()
            if loop.time() - healthy_since >= seconds:
                return plan
        else:
            healthy_since = None
        await asyncio.sleep(ctl.cluster.recheck_interval)
    return None


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(COUNT))
async def test_soak(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(seed)
    pool = SshPool(reconnect_initial=0.05, reconnect_max=0.2)
    tally = Tally()
    notes: list[str] = []
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        clock = SteppedClock()
        ctl = controller(world, pool, tmp_path / "state", wall_clock=clock)
        assert ctl.cluster.policy.budget == 3, "the soak runs at the shipped budget"
        roles = {h.name: h.role for h in ctl.cluster.hosts}
        # Health that lasted `healthy_reset` as sparkd judges it (its plans are stamped at the
        # start of their observation): a few rechecks more than the reset itself.
        reset = ctl.cluster.policy.healthy_reset + 5 * ctl.cluster.recheck_interval
        try:
            assert await until_healthy_for(ctl, reset, []) is not None, "cold start failed"
            for _ in range(FAULTS):
                fault = rng.choice(CHOICES)
                host = "spark-a" if fault.role == "head" else "spark-b"
                if fault.name == "clock-step":
                    clock.step += rng.uniform(-CLOCK_STEP, CLOCK_STEP)
                for name in fault.name.split("+") if fault.name != "clock-step" else ():
                    await world.fault(name, host, fault.arg)
                await asyncio.sleep(rng.uniform(0, 0.5))
                outcomes: list[ActionOutcome] = []
                if fault.lasts:
                    await until_healthy_for(ctl, float("inf"), outcomes, limit=fault.lasts)
                    await world.fault("heal", host)
                elif fault.fixed_by is not None:
                    ctl.on_action = collect(outcomes)
                    waited = [await ctl.cycle() for _ in range(WAIT_CYCLES)]
                    if waited[-1].phase != "blocked":
                        tally.missed += 1
                        notes.append(f"{fault.name} on {host} not blocked: {waited[-1].reason}")
                    # A model launch before the human's fix is one that could not apply.
                    early = [o for o in outcomes if o.action.kind in MODEL_LAUNCHES]
                    tally.false_remediations += len(early)
                    notes.extend(f"{fault.name} on {host}: launched while unfixable" for _ in early)
                    await world.fault(fault.fixed_by, host)
                done = await until_healthy_for(ctl, reset, outcomes)
                if done is None:
                    tally.missed += 1
                    plan = ctl.view.plan
                    notes.append(
                        f"missed {fault.name} on {host}: {plan.phase if plan else None}: "
                        f"{plan.reason if plan else None}; did: {describe(outcomes)}"
                    )
                    break
                wrong = judge(fault, outcomes, roles)
                tally.false_remediations += len(wrong)
                notes.extend(
                    f"{fault.name} on {host}: {w}; did: {describe(outcomes)}" for w in wrong
                )
        finally:
            await pool.close()
    with capsys.disabled():
        print(
            f"\nsoak seed {seed}: {FAULTS} faults, {tally.false_remediations} false "
            f"remediations, {tally.missed} missed faults"
        )
        for note in notes:
            print(f"  {note}")
    assert (tally.false_remediations, tally.missed) == (0, 0), notes
