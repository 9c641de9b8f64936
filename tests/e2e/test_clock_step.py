"""A wall-clock step on the daemon's side, either way, changes nothing sparkd does (invariant 1).

The controller's wall clock is stepped (as NTP, an RTC wrong at boot or `date -s` would) while
it keeps a healthy, a loading or a settling cluster in the simulated world. Durations run on
the monotonic clock, which does not step: no Ray or model is restarted for it, probes keep
their pace, and the cluster converges as it would have. The step is shown in /status.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkd.model.plan import ActionOutcome
from sparkd.runtime.cluster_view import CycleRecord
from sparkd.runtime.controller import Controller
from sparkd.runtime.status_json import cluster_json
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.e2e.test_events import until
from tests.support.daemon import controller, mutations, running

# Forward: enough to make every Ray node look older than its container, were node sightings
# and container ages compared on the wall clock; back: an hour.
STEPS = [20.0, -3600.0]


@dataclass
class Stepped:
    step: float = 0.0

    def __call__(self) -> float:
        return time.time() + self.step

    def set(self, step: float) -> None:
        self.step = step


def _stepped_controller(world: World, pool: SshPool, state: Path) -> tuple[Stepped, Controller]:
    clock = Stepped()
    return clock, controller(world, pool, state, wall_clock=clock, watch_events=False)


def _finished_ok(ctl: Controller, kind: str, then: Callable[[], None]) -> list[float]:
    """The wall clock at each `kind` action that ends ok, `then` called at each."""
    times: list[float] = []

    def seen(_: Controller, outcome: ActionOutcome) -> None:
        if outcome.action.kind == kind and outcome.result == "ok":
            times.append(time.time())
            then()

    ctl.on_action = seen
    return times


def _restarts(world: World, since: float) -> list[str]:
    """What was (re)started or killed after `since`: Ray containers and the serve process."""
    return [
        r.command
        for r in mutations(world, since=since)
        if r.command.startswith(("docker run", "docker rm", "docker stop", "docker kill"))
        or "vllm serve" in r.command
        or r.command.startswith("kill")
    ]


async def _watch(ctl: Controller, seconds: float) -> list[CycleRecord]:
    records: list[CycleRecord] = []
    ctl.on_record = lambda _, record: records.append(record)
    started = time.monotonic()
    await until(lambda: time.monotonic() - started >= seconds, seconds + 5)
    return records


@pytest.mark.parametrize("delta", STEPS)
async def test_a_healthy_cluster_stays_untouched_across_a_step(
    healthy_world: World, pool: SshPool, tmp_path: Path, delta: float
) -> None:
    clock, ctl = _stepped_controller(healthy_world, pool, tmp_path / "state")
    join = ctl.cluster.ray.join_timeout
    async with running(ctl):
        await until(lambda: ctl.view.plan is not None and ctl.view.plan.converged, 30)
        await until(lambda: ctl.memory.last_probe_at is not None, 10)
        stepped_at = time.time()
        clock.step = delta
        # Past the join timeout (when a node wrongly thought old would be replaced) and
        # several probe intervals.
        records = await _watch(ctl, join + 3 * ctl.cluster.probe_interval)
        assert _restarts(healthy_world, stepped_at) == []
        counted = [r for r in records if r.probe is not None]
        assert len(counted) >= 3, "probing stopped after the step"
        assert ctl.view.plan is not None and ctl.view.plan.phase == "healthy"
        shown = cluster_json(ctl)["clock_step_seconds"]
        assert shown is not None and abs(shown - delta) < 1.0


@pytest.mark.parametrize("delta", STEPS)
async def test_a_load_goes_on_across_a_step(
    seed_world: World, pool: SshPool, tmp_path: Path, delta: float
) -> None:
    clock, ctl = _stepped_controller(seed_world, pool, tmp_path / "state")
    launched = _finished_ok(ctl, "start_model", then=lambda: None)
    async with running(ctl):
        await until(lambda: bool(launched), 60)
        clock.step = delta
        await until(lambda: ctl.view.plan is not None and ctl.view.plan.converged, 90)
        serves = [c for c in _restarts(seed_world, launched[0]) if "vllm serve" in c]
        assert serves == [], "the load was restarted after the step"


@pytest.mark.parametrize("delta", STEPS)
async def test_a_settling_ray_is_waited_on_across_a_step(
    seed_world: World, pool: SshPool, tmp_path: Path, delta: float
) -> None:
    clock, ctl = _stepped_controller(seed_world, pool, tmp_path / "state")
    # Stepped while the new node registers and Ray is still settling.
    worker = _finished_ok(ctl, "start_ray_worker", then=lambda: clock.set(delta))
    async with running(ctl):
        await until(lambda: ctl.view.plan is not None and ctl.view.plan.converged, 120)
        again = [c for c in _restarts(seed_world, worker[0]) if not c.startswith("docker exec")]
        assert not any(c.startswith(("docker run", "docker rm")) for c in again), again
        # What /status shows of the actions is wall clock, as the operator's own clock reads.
        latest = cluster_json(ctl)["recent_actions"][0]
        assert abs(latest["finished_at"] - clock()) < 15.0
