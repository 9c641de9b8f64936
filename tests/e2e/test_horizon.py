"""The controller's own loop looks again when what it waits for is due, not an interval later;
and a cycle whose actions ran is followed by a look at once."""

from __future__ import annotations

import time
from pathlib import Path

from sparkd.model.plan import ActionOutcome
from sparkd.runtime.controller import Controller
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.e2e.test_events import until
from tests.support.daemon import controller, mutations, running

# Far longer than any test here runs: with no event stream, only the horizon can bring the
# next cycle sooner.
LONG = 600.0


def unprompted(world: World, pool: SshPool, state: Path, **cluster: float) -> Controller:
    """A controller with no event stream and an interval of LONG (and any other `cluster`
    settings): what brings its next look is all the test sees."""
    return controller(world, pool, state, cluster={"interval": LONG, **cluster}, watch_events=False)


async def test_a_pause_ending_is_acted_on_at_its_end(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = unprompted(seed_world, pool, tmp_path / "state")
    pause_for = 1.0
    ends = time.time() + pause_for
    ctl.pause("swapping a cable", "ops", until=ends)
    outcomes: list[ActionOutcome] = []
    ctl.on_action = lambda _, outcome: outcomes.append(outcome)
    async with running(ctl):
        await until(lambda: bool(outcomes), 30)
        first = min(m.at for m in mutations(seed_world))
        # Nothing while paused; then remediation within a recheck of the end, not an interval.
        assert first >= ends
        assert first - ends < 5.0


async def test_a_recovery_looks_again_as_soon_as_its_actions_finish(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    # A recheck interval far longer than the test: every look after the first has to come
    # from actions finishing (or from the horizon), never from the recheck timer.
    ctl = unprompted(seed_world, pool, tmp_path / "state", recheck_interval=LONG)
    phases: list[str] = []
    ctl.on_plan = lambda c: phases.append(c.view.plan.phase if c.view.plan else "")
    async with running(ctl):
        await until(lambda: "starting_ray" in phases, 20)
        # Cleaning, then Ray: each stage's actions are followed by the next look at once.
        assert "cleaning" in phases
