"""What a controller shows of its cluster (the API, the CLI, the metrics read it), the cycle in
progress, what one cycle did (the metrics record it), and whether the controller makes
progress (the watchdog and /healthz ask)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sparkd.model.memory import Memory
from sparkd.model.observed import Observed
from sparkd.model.plan import Action, ActionOutcome, Plan
from sparkd.model.probe import ProbeOutcome, ProbeResult

RECENT_ACTIONS = 50
# The reasoning-only ratio is taken over this many of the latest healthy probes.
PROBE_WINDOW = 20

# The rollout events that are a rollout's result (sparkd_rollouts_total{result}).
RESULT_OF = {
    "rollout_accepted": "accepted",
    "rolled_back": "rolled_back",
    "rollback_failed": "rollback_failed",
}


@dataclass
class ClusterView:
    """What the API and the CLI show of a cluster; replaced, never mutated in place by readers."""

    snapshot: Observed | None = None
    plan: Plan | None = None
    recent: deque[ActionOutcome] = field(default_factory=lambda: deque(maxlen=RECENT_ACTIONS))
    in_flight: Action | None = None
    cycles: int = 0
    last_cycle_at: float | None = None
    last_error: str | None = None
    # Outcomes of the latest healthy probes (answer or reasoning_only), newest last.
    probe_window: deque[ProbeOutcome] = field(default_factory=lambda: deque(maxlen=PROBE_WINDOW))
    last_probe_success_at: float | None = None
    # How far the ops box's wall clock has stepped against daemon time (None: no step).
    clock_step: float | None = None

    @property
    def reasoning_only_ratio(self) -> float | None:
        """reasoning_only / (answer + reasoning_only) over the window; None before any."""
        if not self.probe_window:
            return None
        return sum(o == "reasoning_only" for o in self.probe_window) / len(self.probe_window)

    def cycle_done(self, snapshot: Observed, plan: Plan, at: float) -> None:
        """A cycle finished at `at` (wall clock) with this reading and plan."""
        self.snapshot = snapshot
        self.plan = plan
        self.cycles += 1
        self.last_cycle_at = at
        self.last_error = None
        self.in_flight = None

    def probed(self, outcome: ProbeOutcome, at: float) -> None:
        """A new healthy probe, taken at `at` (wall clock)."""
        self.probe_window.append(outcome)
        self.last_probe_success_at = at


@dataclass(frozen=True)
class CycleRecord:
    """What one cycle did, for the metrics: `ok` False means it raised (the rest is empty)."""

    ok: bool
    seconds: float
    observed: Observed | None = None
    plan: Plan | None = None
    # The probe taken in this cycle, when it is one the planner had not seen.
    probe: ProbeResult | None = None
    rebooted: tuple[str, ...] = ()
    outcomes: tuple[ActionOutcome, ...] = ()
    # Results a rollout reached in this cycle (accepted, rolled_back, rollback_failed).
    rollout_results: tuple[str, ...] = ()


@dataclass
class CycleInProgress:
    """The cycle in progress, so that each finished action can be learnt and persisted."""

    before: Memory
    observed: Observed
    plan: Plan
    events: list[dict[str, Any]]
    outcomes: list[ActionOutcome] = field(default_factory=list)
    blocked_noted: bool = False
    rollout_noted: set[str] = field(default_factory=set)


def liveness(
    now: float,
    *,
    action_deadline: float | None,
    observe_deadline: float | None,
    progress_at: float,
    interval: float,
) -> tuple[bool, str]:
    """Making progress: a cycle finished within 3 intervals, or a look or an action runs
    within its own timeouts (all in elapsed time)."""
    if action_deadline is not None:
        if now <= action_deadline:
            return True, "action in progress"
        return False, "action overran its timeout"
    if observe_deadline is not None:
        if now <= observe_deadline:
            return True, "observing"
        return False, "observation overran its timeouts"
    age = now - progress_at
    if age <= 3 * interval:
        return True, "ok"
    return False, f"no cycle finished for {age:.0f}s"
