"""Rollouts: a change of spec is accepted only once it serves, otherwise undone. Pure.

The spec that last reached lasting health (N healthy probes in a row, `rollout.acceptance_probes`)
is kept as last-good. A change from it is one rollout: cut over once, accepted after N healthy
probes of the new spec. When the new spec fails on evidence (core.judging.model_stage's `failed`,
the probe failing it before acceptance, its restart budget spent, its answers reaching no content:
`output_fault`), the planner relaunches the last-good spec and holds it (`degraded`, "rolled back
from SPEC to LAST-GOOD: WHY") until the config changes again or an operator retries. A rollback that
itself fails latches `blocked`.

Specs are named by their model spec hash without the key (`identity`): what the running serve
carries beside its log, stable across sparkd upgrades, a key rotation aside.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.core import policy
from sparkd.core.spec import identity, spec_of
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import GoodSpec, Memory, Rollout
from sparkd.model.observed import Observed
from sparkd.model.plan import MODEL_STARTS, Plan


@dataclass(frozen=True)
class Steer:
    """What the planner works towards this cycle, and whether it may roll back."""

    spec: ClusterSpec
    desired_hash: str
    # Set while the last-good spec stands in for the desired one: the rollout it undid.
    held: Rollout | None = None
    good: ClusterSpec | None = None
    # A failure of the running launch now means a rollback (rather than a retry).
    may_roll_back: bool = False

    def rollback_reason(self, why: str) -> str:
        good = self.good_hash
        return f"rolled back from {self.desired_hash} to {good}: {why}"

    @property
    def good_hash(self) -> str:
        return identity(self.good) if self.good is not None else "?"


def steer(desired: ClusterSpec, memory: Memory) -> Steer:
    want = identity(desired)
    good = memory.last_good
    if good is None or good.hash == want:
        return Steer(spec=desired, desired_hash=want)
    last = spec_of(desired, good)
    rollout = memory.rollout
    ours = rollout is not None and rollout.to_hash == want
    if ours and rollout is not None and rollout.rolled_back is not None:
        if rollout.result == "rolled_back":
            return Steer(spec=last, desired_hash=want, held=rollout, good=last)
        return Steer(spec=desired, desired_hash=want, good=last)
    # The launch being judged is of this rollout: tried after it began (a serve that exits at
    # once fails its start action, so no launch is recorded). A rollout not yet recorded (this
    # very cycle's cutover) has nothing of its own to judge.
    of_rollout = rollout is not None and ours and _tried_since(memory, rollout.began_at)
    accepted = rollout is not None and rollout.accepted_at is not None
    may = desired.rollout.rollback and of_rollout and not accepted
    return Steer(spec=desired, desired_hash=want, good=last, may_roll_back=may)


def output_fault(desired: ClusterSpec, observed: Observed, memory: Memory) -> str | None:
    """Why the spec being judged failed on its own output: this cycle's probe ended its turn
    with reasoning and no content (a chat template or reasoning parser that the spec brought).
    A restart of the same spec reproduces it; the last-good spec, which served, may not. At
    `probe.temperature` 0 one such probe; above it, two in a row (one may be chance)."""
    probe = observed.probe
    if probe is not None and probe.config_fault and policy.is_new_probe(memory, probe):
        # The new spec's server answers the probe 4xx (a served name, a key, a request it
        # refuses): the same for every restart, and the last-good spec answered.
        return f"its server refuses the probe (a config fault: {probe.verdict.detail})"
    if probe is None or not probe.output_fault or not policy.is_new_probe(memory, probe):
        return None
    before = memory.last_probe
    if desired.probe.temperature > 0 and (before is None or not before.output_fault):
        return None
    return f"its answers reach no content (probe no_answer: {probe.verdict.detail})"


def prepare_due(desired: ClusterSpec, memory: Memory) -> bool:
    """The desired spec has not served yet (a change, or the first deployment): before its
    cutover the head's model files are read and checked (core.judging.weights). Not once the cutover
    has stopped the old serve (nothing is left to keep serving), nor while a rollback holds
    the last-good spec."""
    good = memory.last_good
    want = identity(desired)
    if good is not None and good.hash == want:
        return False
    record = memory.rollout
    if record is not None and record.to_hash == want:
        return record.stopped_at is None and record.rolled_back is None
    return True


def checks_due(desired: ClusterSpec, memory: Memory) -> bool:
    """The acceptance checks run with the probe that would accept the rollout's spec, until
    they have passed once."""
    record = memory.rollout
    return (
        bool(desired.rollout.checks)
        and record is not None
        and record.to_hash == identity(desired)
        and record.result == "in_progress"
        and not record.checked
        and memory.healthy_probes + 1 >= desired.rollout.acceptance_probes
    )


def acting_spec(desired: ClusterSpec, memory: Memory, plan: Plan) -> ClusterSpec:
    """The spec a plan's actions launch: the last-good one when the plan rolls back or a
    rollback holds, else the desired one (`memory` is what the plan was made from)."""
    if plan.rollback is not None and memory.last_good is not None:
        return spec_of(desired, memory.last_good)
    return steer(desired, memory).spec


def failed_rollback(steer: Steer, memory: Memory) -> bool:
    """The last-good spec, relaunched by a rollback, failed before it served again."""
    held = steer.held
    return (
        held is not None
        and held.restored_at is None
        and held.rolled_back_at is not None
        and _tried_since(memory, held.rolled_back_at)
    )


def _tried_since(memory: Memory, since: float) -> bool:
    """A model start was tried at or after `since`, whatever became of it."""
    return any(a.at >= since and a.key.split(":", 1)[0] in MODEL_STARTS for a in memory.attempts)


def latch_reason(steer: Steer, why: str) -> str:
    held = steer.held
    first = held.rolled_back if held is not None else "?"
    return (
        f"rollback to {steer.good_hash} failed: {why}; the rollout of {steer.desired_hash} had "
        f"failed: {first}"
    )


def retry(memory: Memory, desired: ClusterSpec) -> Memory:
    """`sparkd rollout retry`: the held rollout ends; the desired spec is rolled out anew (a
    new rollout, so it may roll back once more). A latch from a failed rollback goes too.

    Unchanged (the API answers 409) unless the held rollback is of the desired spec: one held
    for a spec the config no longer asks for has nothing to retry. Only the attempts made since
    the rollout began are forgiven: a host's power cycle or a latched kill from before it is
    another incident's budget, not the rollout's to give back."""
    rollout = memory.rollout
    if rollout is None or rollout.rolled_back is None or rollout.to_hash != identity(desired):
        return memory
    blocked = None if rollout.result == "rollback_failed" else memory.blocked
    kept = tuple(a for a in memory.attempts if a.at < rollout.began_at)
    return memory.evolve(rollout=None, blocked=blocked, attempts=kept)


def back(
    memory: Memory,
    desired: ClusterSpec,
    by: str,
    now: float,
    wall: float,
    good: GoodSpec | None = None,
) -> Memory:
    """`sparkd rollout back`: go to the last-good spec now, and hold it as a rollback does.

    `good`: the last-good spec when the operator asked (default: memory's). The request is
    applied again on top of what the cycle running meanwhile learnt; if that cycle accepted the
    rollout, memory's last-good is already the new spec, and the operator's spec is restored."""
    good = good if good is not None else memory.last_good
    want = identity(desired)
    if good is None or good.hash == want:
        return memory
    rollout = memory.rollout
    if rollout is None or rollout.to_hash != want:
        seq = memory.rollout_seq + 1
        rollout = Rollout(id=seq, started=wall, began_at=now, from_hash=good.hash, to_hash=want)
        memory = memory.evolve(rollout_seq=seq)
    if rollout.result == "rolled_back":
        return memory
    held = rollout.model_copy(
        update={
            "rolled_back": f"asked by {by}",
            "rolled_back_at": now,
            "result": "rolled_back",
            "restored_at": None,
        }
    )
    return memory.evolve(rollout=held, last_good=good)


def differs(desired: ClusterSpec, good: GoodSpec | None) -> list[str]:
    """What the desired spec changes from the last-good one, `section.key: OLD -> NEW`."""
    if good is None:
        return []
    found: list[str] = []
    for section, was in (("ray", good.ray), ("model", good.model)):
        now = getattr(desired, section).model_dump(mode="json")
        for name in sorted(set(was) | set(now)):
            if was.get(name) != now.get(name):
                found.append(f"{section}.{name}: {was.get(name)!r} -> {now.get(name)!r}")
    return found
