"""The controller's own loop looks again when what it waits for is due, not an interval later;
and a cycle whose actions ran is followed by a look at once."""

from __future__ import annotations

import time
from pathlib import Path

from sparkd.model.plan import ActionOutcome, Plan
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
    ctl.requests.pause("swapping a cable", "ops", until=ends)
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
    # A recheck interval far longer than the test and no event stream: a look soon after the
    # first can only come from its actions finishing, or from what the plan itself waits on.
    ctl = unprompted(seed_world, pool, tmp_path / "state", recheck_interval=LONG)
    looks: list[tuple[float, Plan, float]] = []

    def seen(c: Controller) -> None:
        # Made before its actions run: when the look after it would come without them.
        assert c.view.plan is not None
        looks.append((time.monotonic(), c.view.plan, c.next_look().delay))

    ctl.on_plan = seen
    async with running(ctl):
        await until(lambda: len(looks) >= 2, 20)
    (first_at, first, waits), (second_at, _, _) = looks[:2]
    # The seed's morning: stale units and containers to clean, Ray to start. Whether the next
    # look still finds Ray settling or already registered depends on how fast it comes.
    assert first.phase == "cleaning" and first.actions, first.reason
    assert second_at - first_at < waits, (second_at - first_at, waits)
