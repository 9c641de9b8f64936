"""A rollout's record after a cycle: healthy probes of the launch, the rollout's progress,
downtime and result, the last-good spec; and the events a cycle made of it. Pure.

Part of memory's transition after a cycle (core.remembering.remember.after_cycle); what a
rollout decides (steer, roll back, hold) is core.deciding.rollout's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparkd.core import policy
from sparkd.core.judging import acceptance
from sparkd.core.spec import good_of, identity, model_spec_hashes, spec_of
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory, Rollout
from sparkd.model.observed import Observed
from sparkd.model.plan import MODEL_STARTS, STOPS, ActionOutcome, Plan


def track(
    before: Memory,
    memory: Memory,
    desired: ClusterSpec,
    observed: Observed,
    outcomes: Sequence[ActionOutcome],
    plan: Plan,
    now: float,
    wall: float,
) -> Memory:
    """Memory after a cycle (`memory`, from remember()) with the rollout's bookkeeping: healthy
    probes of this launch, the rollout record, its downtime and result, the last-good spec."""
    changes: dict[str, Any] = {}
    launched = any(o.action.kind in MODEL_STARTS and o.result == "ok" for o in outcomes)
    healthy = before.healthy_probes
    probe = observed.probe
    if policy.is_new_probe(before, probe) and probe is not None:
        healthy = healthy + 1 if probe.verdict.healthy is True else 0
    if launched:
        healthy = 0
    changes["healthy_probes"] = healthy
    want = identity(desired)
    good = memory.last_good
    rollout = memory.rollout
    if rollout is not None and rollout.to_hash != want and rollout.result == "in_progress":
        rollout = rollout.model_copy(update={"result": "superseded"})
    if good is not None and good.hash != want and (rollout is None or rollout.to_hash != want):
        seq = memory.rollout_seq + 1
        changes["rollout_seq"] = seq
        rollout = Rollout(
            id=seq,
            started=wall,
            began_at=observed.observed_at,
            from_hash=good.hash,
            to_hash=want,
        )
    if rollout is not None and rollout.to_hash == want:
        rollout = _progress(rollout, outcomes, plan, observed.observed_at)
    serve = observed.serve
    key = observed.api_key_fingerprint
    running = serve.spec_hash if serve is not None and serve.running else None
    accepted = plan.learned.serving_well and healthy >= desired.rollout.acceptance_probes
    if (
        rollout is not None
        and rollout.to_hash == want
        and acceptance.passed(observed.checks, len(desired.rollout.checks))
    ):
        rollout = rollout.model_copy(update={"checked": True})
    checked = rollout is None or rollout.to_hash != want or rollout.checked
    checked = checked or not desired.rollout.checks
    held = rollout is not None and rollout.to_hash == want and rollout.result == "rolled_back"
    if held and rollout is not None and good is not None:
        last = spec_of(desired, good)
        if rollout.restored_at is None and accepted and running in model_spec_hashes(last, key):
            rollout = rollout.model_copy(update={"restored_at": now})
    elif accepted and checked and running in model_spec_hashes(desired, key):
        if good is None or good.hash != want:
            changes["last_good"] = good_of(desired, key, now)
        if rollout is not None and rollout.to_hash == want and rollout.result == "in_progress":
            stopped = rollout.stopped_at
            downtime = now - stopped if stopped is not None else None
            rollout = rollout.model_copy(
                update={"result": "accepted", "accepted_at": now, "downtime": downtime}
            )
            changes["rollout_downtime"] = downtime
    changes["rollout"] = rollout
    return memory.evolve(**changes)


def _progress(
    rollout: Rollout, outcomes: Sequence[ActionOutcome], plan: Plan, seen: float
) -> Rollout:
    """`seen`: when the cycle observed, before its actions (a rollback is dated from it, so
    its own launch counts as the rollback's)."""
    update: dict[str, Any] = {}
    if rollout.stopped_at is None and rollout.rolled_back is None:
        stops = [o.started_at for o in outcomes if o.action.kind in STOPS and o.result != "skipped"]
        if stops:
            update["stopped_at"] = min(stops)
    if plan.rollback is not None and rollout.rolled_back is None:
        update.update(rolled_back=plan.rollback, rolled_back_at=seen, result="rolled_back")
    if plan.latch is not None and rollout.result == "rolled_back":
        update["result"] = "rollback_failed"
    return rollout.model_copy(update=update) if update else rollout


def events(before: Rollout | None, after: Rollout | None) -> list[tuple[str, dict[str, Any]]]:
    """What a cycle did to the rollout, as events: started, accepted, rolled back, or a
    rollback that failed."""
    if after is None:
        return []
    fields: dict[str, Any] = {
        "rollout": after.id,
        "spec": after.to_hash,
        "last_good": after.from_hash,
    }
    found: list[tuple[str, dict[str, Any]]] = []
    if before is None or before.id != after.id:
        found.append(("rollout_started", fields))
    was = before.result if before is not None and before.id == after.id else "in_progress"
    if after.result != was:
        if after.result == "accepted":
            found.append(("rollout_accepted", {**fields, "downtime": after.downtime}))
        elif after.result == "rolled_back":
            found.append(("rolled_back", {**fields, "reason": after.rolled_back}))
        elif after.result == "rollback_failed":
            found.append(("rollback_failed", {**fields, "reason": after.rolled_back}))
    return found
