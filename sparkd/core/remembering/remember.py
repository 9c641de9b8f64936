"""How memory changes: `after_cycle(before, observed, outcomes, now, plan, desired, wall=...)`
after each cycle (`remember`, then the rollout's record). Pure.

Also the operator's edits to memory (pause, resume), so every change of memory is a function
of values, testable without a daemon. Every change goes through `Memory.evolve`, which rejects
a field that does not exist and validates each value. `now` is daemon time and `wall` the wall
clock (sparkd.core.clock): only a pause is judged on the wall.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from sparkd.core import policy
from sparkd.core.clock import bounded
from sparkd.core.judging import fabric, triage
from sparkd.core.judging.evidence import of_this_launch
from sparkd.core.reading.placement import placed_nodes
from sparkd.core.remembering import rollout_record
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Attempt, Blocked, Memory, Pause
from sparkd.model.observed import REFUSALS, SILENT_ERRORS, Fabric, HostFacts, Observed
from sparkd.model.plan import MODEL_STARTS, RAY_STARTS, ActionOutcome, Plan

# Attempts older than any sane budget window are of no use; keep memory bounded.
MAX_ATTEMPTS = 256
MAX_REASON = 300
# Times a host went unreachable kept per host: enough to say "N times in M minutes".
MAX_LOSSES = 32


def remember(
    memory: Memory,
    observed: Observed,
    outcomes: Sequence[ActionOutcome],
    now: float,
    plan: Plan | None = None,
    *,
    wall: float | None = None,
) -> Memory:
    memory = bounded(memory, now)
    # Nothing learnt about an older serve process carries over to the one running now.
    memory = of_this_launch(memory, observed)
    wall_now = now if wall is None else wall
    changes: dict[str, object] = {}

    boot_ids = dict(memory.boot_ids)
    for host in observed.hosts:
        if host.boot_id:
            boot_ids[host.name] = host.boot_id
    changes["boot_ids"] = boot_ids

    # The last kernel log seen from each host: a host that stops answering keeps its omens,
    # the evidence that it wedged; a rebooted host's old log is no evidence of anything.
    kernel_omens = dict(memory.kernel_omens)
    for host in observed.hosts:
        rebooted = host.boot_id and memory.boot_ids.get(host.name) not in (None, host.boot_id)
        if rebooted:
            kernel_omens.pop(host.name, None)
        if not host.reachable or host.kernel is None:
            continue
        omen = triage.omens(host.kernel)
        if omen is None:
            kernel_omens.pop(host.name, None)
        else:
            kernel_omens[host.name] = omen
    changes["kernel_omens"] = kernel_omens
    # When each omen was first seen (this look's, if it is in this look's log and memory has no
    # stamp): one seen long before a silence does not explain it; one of unknown age neither.
    seen_now = {h.name for h in observed.hosts if h.reachable and h.kernel is not None}
    changes["omen_at"] = {
        host: stamp
        for host in kernel_omens
        if (stamp := memory.omen_at.get(host, observed.observed_at if host in seen_now else None))
        is not None
    }
    # Answers that refuse sparkd (a key, a host key, a connection) and a failing nvidia-smi on a
    # host that answers: held, and past `policy.hold_cap` `blocked` for a human.
    changes["refusing_since"] = {
        host.name: memory.refusing_since.get(host.name, observed.observed_at)
        for host in observed.hosts
        if host.error is not None and host.error.kind in REFUSALS
    }
    changes["gpu_unknown_since"] = {
        host.name: memory.gpu_unknown_since.get(host.name, observed.observed_at)
        for host in observed.hosts
        if host.reachable and host.gpu_error is not None
    }
    changes["owner_unknown_since"] = {
        host.name: memory.owner_unknown_since.get(host.name, observed.observed_at)
        for host in observed.hosts
        if host.reachable and any(p.owner_unknown for p in host.gpu_processes)
    }
    # Silence only: a host that refused the key or the connection for an hour and then went
    # quiet has been silent for one look, not an hour (a power cycle waits on silence alone).
    changes["unreachable_since"] = {
        host.name: memory.unreachable_since.get(host.name, observed.observed_at)
        for host in observed.hosts
        if host.error is not None and host.error.kind in SILENT_ERRORS
    }

    carriers = dict(memory.carrier_changes)
    flapped = dict(memory.flapped_at)
    for host, count in _readings(observed, lambda f: f.carrier_changes):
        rebooted = host.boot_id and memory.boot_ids.get(host.name) not in (None, host.boot_id)
        if not rebooted and fabric.carrier_changed(carriers.get(host.name), count):
            flapped[host.name] = observed.observed_at
        carriers[host.name] = count
    changes["carrier_changes"] = carriers

    gids = dict(memory.gid_indexes)
    moved = dict(memory.gid_moved)
    for host, index in _readings(observed, lambda f: f.gid_index):
        before = gids.get(host.name)
        if before is not None and before != index:
            moved[host.name] = (before, index, observed.observed_at)
        gids[host.name] = index
    changes["gid_indexes"] = gids
    changes["gid_moved"] = moved
    changes["flapped_at"] = flapped

    attempts = list(memory.attempts)
    for outcome in outcomes:
        if outcome.result == "skipped":
            continue
        attempts.append(
            Attempt(
                key=outcome.action.key,
                at=outcome.started_at,
                ok=outcome.result == "ok",
                reason=outcome.action.reason[:MAX_REASON],
            )
        )
    changes["attempts"] = tuple(attempts[-MAX_ATTEMPTS:])
    changes.update(_reachability(memory, observed, now))

    ray = observed.ray
    if ray is not None and ray.up:
        # First sightings of the ALIVE nodes; a node no longer ALIVE is forgotten.
        changes["ray_seen"] = {
            node: memory.ray_seen.get(node, observed.observed_at) for node in ray.alive_node_ids
        }
    ray_started = dict(memory.ray_started)
    for outcome in outcomes:
        if outcome.action.kind in RAY_STARTS and outcome.result in ("ok", "timeout"):
            ray_started[outcome.action.host] = outcome.started_at
    changes["ray_started"] = ray_started

    probe = observed.probe
    if policy.is_new_probe(memory, probe) and probe is not None:
        # The planner's count of this probe where it made one, else the policy's own.
        taught = plan.learned if plan is not None else None
        counted = taught is not None and taught.probe_failures is not None
        changes["consecutive_failures"] = (
            taught.probe_failures
            if taught is not None and taught.probe_failures is not None
            else policy.failures_after(memory, probe)
        )
        changes["busy_streak"] = (
            taught.busy_streak
            if counted and taught is not None and taught.busy_streak is not None
            else policy.busy_streak_after(memory, probe)
        )
        changes["unknown_streak"] = (
            taught.unknown_streak
            if counted and taught is not None and taught.unknown_streak is not None
            else policy.unknown_streak_after(memory, probe)
        )
        changes["last_probe_at"] = probe.at
        changes["last_probe"] = probe

    launched = [o for o in outcomes if o.action.kind in MODEL_STARTS and o.result == "ok"]
    ray_restarted = any(o.action.kind in RAY_STARTS and o.result == "ok" for o in outcomes)
    if launched:
        changes.update(
            launched_at=launched[-1].finished_at,
            launch_nodes=observed.ray.alive_node_ids if observed.ray is not None else (),
            model_ready_at=None,
            consecutive_failures=0,
            busy_streak=0,
            unknown_streak=0,
            last_probe_at=launched[-1].finished_at,
            last_probe=None,
            load_mark=None,
            token_mark=None,
        )
    elif ray_restarted:
        # The model's Ray actors die with Ray; launch_nodes stays, so the planner sees the
        # node ids change and relaunches the model.
        changes.update(model_ready_at=None)
    placed = placed_nodes(observed.serve)
    if placed and not launched and memory.launched_at is not None:
        # Where the placement group went, by the log's word: the nodes Ray listed when sparkd
        # launched can hold one whose container had just exited (a launch that then waited for
        # the restarted node), and the log's lines later scroll out of the tail that is read.
        changes["launch_nodes"] = placed

    if plan is not None:
        learned = plan.learned
        if learned.model_ready and not launched and memory.model_ready_at is None:
            changes["model_ready_at"] = now
            if (
                memory.launched_at is not None
                and not memory.launch_nodes
                and not placed
                and observed.ray is not None
                and learned.ray_ready
            ):
                changes["launch_nodes"] = observed.ray.alive_node_ids
        if learned.serving_well:
            changes["healthy_since"] = memory.healthy_since or now
        else:
            changes["healthy_since"] = None
        if learned.reset_backoff:
            changes["backoff_reset_at"] = now
        if plan.latch is not None and memory.blocked is None:
            changes["blocked"] = Blocked(reason=plan.latch, since=now)
        if learned.ray_unsettled:
            changes["ray_unsettled_since"] = memory.ray_unsettled_since or now
        else:
            changes["ray_unsettled_since"] = None
        if not launched:
            changes["load_mark"] = learned.load_mark
            changes["token_mark"] = learned.token_mark
        relaunched = bool(launched) or ray_restarted
        held_since = _fabric_held(memory, plan, now, relaunched)
        changes["fabric_held_since"] = held_since
        ended = memory.fabric_sound_at
        changes["fabric_sound_at"] = (
            None
            if learned.fabric_held or held_since is None
            else (observed.observed_at if ended is None else ended)
        )
        if learned.adopted is not None and memory.adopted is None:
            # As if sparkd had launched it: the launch is the adoption, the model answered.
            changes.update(
                adopted=learned.adopted,
                launched_at=learned.adopted.at,
                launch_nodes=observed.ray.alive_node_ids if observed.ray is not None else (),
            )
        elif learned.adoption_over:
            changes["adopted"] = None
        changes["adopting_since"] = (memory.adopting_since or now) if learned.adopting else None
        changes["last_phase"] = plan.phase
        changes["last_reason"] = plan.reason
        changes["memory_held"] = not launched and (learned.memory_held or memory.memory_held)
        paused = memory.paused
        if plan.phase != "paused" and paused is not None and not paused.active(wall_now):
            changes["paused"] = None
    return memory.evolve(**changes)


def _readings(
    observed: Observed, read: Callable[[Fabric], int | None]
) -> Iterator[tuple[HostFacts, int]]:
    """Each host's reading of one of its data link's counters, where the look has one."""
    for host in observed.hosts:
        value = read(host.fabric) if host.fabric is not None else None
        if value is not None:
            yield host, value


def _fabric_held(memory: Memory, plan: Plan, now: float, relaunched: bool) -> float | None:
    """Since when a fabric hold has lasted over the running model: kept until the model is
    relaunched (by the recovery or otherwise) or serves well again (nothing hung)."""
    if plan.learned.fabric_held:
        return memory.fabric_held_since if memory.fabric_held_since is not None else now
    if relaunched or plan.learned.serving_well:
        return None
    return memory.fabric_held_since


def _reachability(memory: Memory, observed: Observed, now: float) -> dict[str, object]:
    down = tuple(sorted(h.name for h in observed.hosts if not h.reachable))
    went = {
        host: kept
        for host, times in memory.went_unreachable.items()
        if (kept := tuple(t for t in times if t >= memory.backoff_reset_at)[-MAX_LOSSES:])
    }
    for host in down:
        if host not in memory.unreachable:
            went[host] = (*went.get(host, ()), now)[-MAX_LOSSES:]
    return {"unreachable": down, "went_unreachable": went}


def intend(memory: Memory, key: str, at: float, reason: str = "") -> Memory:
    """Memory with an attempt at `key` charged before it is made (`at` in daemon time): an
    action cut short by a kill is counted as tried. The attempt's outcome replaces it
    (`remember` starts from the memory before the cycle)."""
    attempts = (*memory.attempts, Attempt(key=key, at=at, ok=False, reason=reason))
    return memory.evolve(attempts=attempts[-MAX_ATTEMPTS:])


def pause(memory: Memory, *, reason: str, by: str, now: float, until: float | None) -> Memory:
    """`now` and `until` are wall clock: the operator's intent."""
    return memory.evolve(paused=Pause(reason=reason, by=by, since=now, until=until))


def resume(memory: Memory) -> Memory:
    """Clear a pause and a `blocked` latch, with a fresh budget: a human has looked."""
    return memory.evolve(paused=None, blocked=None, attempts=(), consecutive_failures=0)


def after_cycle(
    before: Memory,
    observed: Observed,
    outcomes: Sequence[ActionOutcome],
    now: float,
    plan: Plan,
    desired: ClusterSpec,
    *,
    wall: float,
) -> Memory:
    """Memory after a cycle, in one step: what the look and the actions taught (`remember`),
    then the rollout's record (core.remembering.rollout_record), both from the memory the plan
    was made from."""
    learnt = remember(before, observed, outcomes, now, plan, wall=wall)
    return rollout_record.track(before, learnt, desired, observed, outcomes, plan, now, wall)
