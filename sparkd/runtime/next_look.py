"""When a controller looks next, with no event to wake it: one decision, taken from the plan.

Events (a host's event stream, an operator, a maintenance edge) only wake the loop sooner;
this says how long it waits otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.model.plan import Plan

# "unreachable": a host coming back is seen within a recheck (its event stream, lost with it,
# has nothing to say until it is set up again).
WORK_IN_PROGRESS = frozenset(
    {"unreachable", "cleaning", "starting_ray", "starting_model", "loading", "probing"}
)


@dataclass(frozen=True)
class NextLook:
    """`delay` seconds until the next cycle; `at_once` skips the rest after a wake-up too."""

    delay: float
    why: str
    at_once: bool = False


def next_look(
    plan: Plan | None,
    *,
    acted: bool,
    failed: bool,
    interval: float,
    recheck_interval: float,
    now: float,
    window_ends_in: float | None = None,
) -> NextLook:
    """`now` is daemon time, as the plan's horizon (`recheck_at`) is; `window_ends_in` is how
    many seconds the open maintenance window has left (wall clock, so as an interval).

    What the actions did is worth seeing at once, not a recheck later (budget and backoff bound
    how often); a failed cycle or one without a plan looks again within a recheck; so does work
    in progress; a converged cluster waits the interval. A horizon (a backoff, a deadline, a
    probe due, the window's end) that comes first shortens either."""
    if acted:
        return NextLook(0.0, "acted", at_once=True)
    if plan is None or failed:
        return NextLook(recheck_interval, "no plan" if plan is None else "cycle failed")
    if plan.actions or plan.phase in WORK_IN_PROGRESS:
        delay, why = recheck_interval, "work in progress"
    else:
        delay, why = interval, "converged" if plan.converged else "idle"
    ahead = [
        t
        for t in (plan.recheck_at, None if window_ends_in is None else now + window_ends_in)
        if t is not None
    ]
    if ahead:
        # Just past the deadline: the planner's limits are strict (`> load_stall`). One that
        # passed while this cycle ran (a look held up by a probe's timeout) is due now, not an
        # interval later.
        due = min(ahead)
        margin = 0.01 * recheck_interval
        soon = due - now + margin if due > now else 0.0
        if soon < delay:
            delay, why = soon, "horizon"
    return NextLook(delay, why)


def wake_rest(recheck_interval: float) -> float:
    """Never back to back on wake-ups: a burst of events waits this long after the last cycle,
    and is then seen by one look."""
    return min(0.1 * recheck_interval, 1.0)
