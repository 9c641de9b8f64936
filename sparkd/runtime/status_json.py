"""What `/status` and the CLI show of a cluster, as JSON: shared by the web API and the CLI, so
neither imports the other (the rollout part is runtime.rollout_json's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparkd.core.judging import engine_stats
from sparkd.model.plan import ActionOutcome
from sparkd.model.snapshot import SnapshotDocument
from sparkd.runtime.rollout_json import rollout_json

if TYPE_CHECKING:
    from sparkd.runtime.controller import Controller


def outcome_json(
    outcome: ActionOutcome, wall_of: Callable[[float], float] = lambda at: at
) -> dict[str, Any]:
    """`wall_of` turns the outcome's daemon-time stamps into wall clock, for people."""
    return {
        **outcome.action.public(),
        "result": outcome.result,
        "detail": outcome.detail,
        "started_at": wall_of(outcome.started_at),
        "finished_at": wall_of(outcome.finished_at),
    }


def _window(controller: Controller) -> dict[str, Any] | None:
    window = controller.maintenance_at(controller.wall_clock())
    if window is None:
        return None
    return {"reason": window.reason, "start": window.start, "end": window.end}


def cluster_json(controller: Controller) -> dict[str, Any]:
    view = controller.view
    memory = controller.memory
    plan = view.plan
    snapshot = (
        SnapshotDocument.of(view.snapshot, memory).model_dump(mode="json")
        if view.snapshot is not None
        else None
    )
    return {
        "cluster": controller.cluster.name,
        "phase": plan.phase if plan is not None else None,
        "reason": plan.reason if plan is not None else "no cycle finished yet",
        "converged": plan.converged if plan is not None else False,
        # The failure classes below vLLM the plan recognised (core.judging.triage.TABLE).
        "triage": list(plan.triage) if plan is not None else [],
        "paused": memory.paused.model_dump(mode="json") if memory.paused is not None else None,
        "blocked": memory.blocked.model_dump(mode="json") if memory.blocked is not None else None,
        "maintenance": _window(controller),
        "dry_run": controller.dry_run,
        "plan": plan.public() if plan is not None else None,
        "in_flight": view.in_flight.public() if view.in_flight is not None else None,
        "recent_actions": [outcome_json(o, controller.clock.wall_of) for o in view.recent],
        "cycles": view.cycles,
        "last_cycle_at": view.last_cycle_at,
        "last_error": view.last_error,
        "persist_error": controller.persist_error,
        # How far the ops box's wall clock stepped against the monotonic clock sparkd measures
        # durations on (null: no step); pauses and windows follow the wall clock.
        "clock_step_seconds": view.clock_step,
        "probes": {
            "reasoning_only_ratio": view.reasoning_only_ratio,
            "window": len(view.probe_window),
            "last_success_at": view.last_probe_success_at,
        },
        # Why vLLM's own metrics are missing (`--disable-log-stats`), or null.
        "vllm_metrics_missing": engine_stats.missing(
            controller.cluster, view.snapshot.endpoint if view.snapshot is not None else None
        ),
        "snapshot": snapshot,
        "rollout": rollout_json(controller),
    }
