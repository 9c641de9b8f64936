"""When a controller looks next with no event (runtime.next_look): one decision, named cases."""

from __future__ import annotations

import pytest

from sparkd.model.plan import Action, Learned, Plan
from sparkd.runtime.next_look import WORK_IN_PROGRESS, next_look

INTERVAL = 30.0
RECHECK = 5.0
NOW = 1000.0


def look(
    plan: Plan | None,
    *,
    acted: bool = False,
    failed: bool = False,
    window_ends_in: float | None = None,
    now: float = NOW,
) -> tuple[float, str, bool]:
    found = next_look(
        plan,
        acted=acted,
        failed=failed,
        interval=INTERVAL,
        recheck_interval=RECHECK,
        now=now,
        window_ends_in=window_ends_in,
    )
    return found.delay, found.why, found.at_once


def converged(recheck_at: float | None = None) -> Plan:
    return Plan(
        cluster="c",
        phase="healthy",
        reason="serving",
        recheck_at=recheck_at,
        learned=Learned(model_ready=True),
    )


RESTART = Action(kind="restart_model", host="h1", target="vllm", reason="hung")


def test_a_converged_cluster_waits_the_interval() -> None:
    assert converged().converged
    assert look(converged()) == (INTERVAL, "converged", False)


def test_actions_taken_are_looked_at_at_once() -> None:
    plan = Plan(cluster="c", phase="starting_model", reason="r", actions=(RESTART,))
    assert look(plan, acted=True) == (0.0, "acted", True)


def test_actions_not_taken_are_looked_at_within_a_recheck() -> None:
    # Another instance owns the cluster, or a pause landed: the plan's actions did not run.
    plan = Plan(cluster="c", phase="degraded", reason="r", actions=(RESTART,))
    assert look(plan) == (RECHECK, "work in progress", False)


@pytest.mark.parametrize("phase", sorted(WORK_IN_PROGRESS))
def test_work_in_progress_is_looked_at_within_a_recheck(phase: str) -> None:
    plan = Plan.model_validate({"cluster": "c", "phase": phase, "reason": "r"})
    assert look(plan)[:2] == (RECHECK, "work in progress")


def test_no_plan_yet_or_a_failed_cycle_looks_again_within_a_recheck() -> None:
    assert look(None) == (RECHECK, "no plan", False)
    assert look(converged(), failed=True) == (RECHECK, "cycle failed", False)


def test_a_horizon_before_the_interval_comes_first_just_past_its_deadline() -> None:
    delay, why, _ = look(converged(recheck_at=NOW + 10.0))
    assert why == "horizon"
    # Just past: the planner's limits are strict, so at the deadline itself nothing changed.
    assert 10.0 < delay <= 10.0 + 0.01 * RECHECK


def test_a_horizon_after_the_interval_does_not_delay_it() -> None:
    assert look(converged(recheck_at=NOW + 100.0)) == (INTERVAL, "converged", False)


def test_a_horizon_that_passed_during_the_cycle_is_due_now() -> None:
    assert look(converged(recheck_at=NOW - 3.0))[:2] == (0.0, "horizon")


def test_a_maintenance_window_ending_first_is_a_horizon() -> None:
    delay, why, _ = look(converged(), window_ends_in=7.0)
    assert why == "horizon"
    assert 7.0 < delay <= 7.0 + 0.01 * RECHECK
    # The earlier of the plan's horizon and the window's end.
    delay, _, _ = look(converged(recheck_at=NOW + 4.0), window_ends_in=7.0)
    assert 4.0 < delay < 7.0
