"""The planner: `plan(desired, observed, memory, now) -> Plan`. Pure: no I/O, no clock.

`now` is daemon time, which cannot step; `wall` (the wall clock, `now` when not given) judges
only a pause's end (sparkd.core.clock).

Every stage is always judged, in dependency order: the hosts (core.judging.cleanup), the image
(core.judging.images), Ray (core.judging.ray_stage), the model (core.judging.model_stage) and the
probe (core.judging.probe_stage). A stage proposes actions and raises holds; here, and only here, a
hold vetoes the actions that need what it makes unsafe (spending no budget), then every remaining
action passes the gate (core.deciding.gate: what else could explain its evidence; a refusal spends
no budget either), then a per-target budget (spent: latch `blocked`) and exponential backoff.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkd.core import policy
from sparkd.core.clock import bounded
from sparkd.core.deciding import gate, rollout
from sparkd.core.deciding.horizon import horizon
from sparkd.core.deciding.power import judge_wedged
from sparkd.core.judging import acceptance, adopt, weights
from sparkd.core.judging.cache import judge_cache
from sparkd.core.judging.cleanup import judge_cleanup, judge_reachability
from sparkd.core.judging.evidence import of_this_launch
from sparkd.core.judging.fabric import judge_fabric, judge_recovery
from sparkd.core.judging.hang import deadline, judge_hang, track
from sparkd.core.judging.images import judge_images
from sparkd.core.judging.judge import Context, Hold, Verdict, ago, from_now
from sparkd.core.judging.load import assess
from sparkd.core.judging.model_stage import judge_model
from sparkd.core.judging.probe_stage import judge_probe
from sparkd.core.judging.ray_stage import judge_ray
from sparkd.core.judging.triage import judge_memory
from sparkd.core.reading import weight_files
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.observed import Observed
from sparkd.model.plan import MODEL_STARTS, STOPS, Action, Learned, Phase, Plan, TriageClass

# Phase precedence when several stages speak: the earliest names the plan.
STAGE_ORDER: tuple[Phase, ...] = (
    "blocked",
    "unreachable",
    "cleaning",
    "starting_ray",
    "starting_model",
    "loading",
    "probing",
    "degraded",
    "healthy",
)


@dataclass
class _Draft:
    """The plan before budget, backoff, pause and dry-run are applied."""

    phase: Phase
    reason: str
    # The cycle's context the actions were judged in: the gate judges them in it too.
    ctx: Context
    # What the look taught memory (remember()), whatever becomes of the actions.
    learned: Learned
    actions: list[Action] = field(default_factory=list)
    triage: tuple[TriageClass, ...] = ()
    # Evidence that the launch judged failed as it would again (core.deciding.rollout rolls back
    # on it).
    failure: str | None = None
    # A host out of reach, wedged or its fabric held: what fails now is not the spec's doing.
    not_the_spec: bool = False
    hang_at: float | None = None
    # First contact (core.judging.adopt): what a rollout to the config would do, shown and never
    # run until the operator decides.
    withheld: list[Action] = field(default_factory=list)

    def blocked(self, cluster: str, latch: str) -> Plan:
        """Latched blocked on `latch`: every action withheld, the judgement still learnt."""
        return Plan(
            cluster=cluster,
            phase="blocked",
            reason=latch,
            withheld=tuple(self.actions),
            latch=latch,
            triage=self.triage,
            learned=self.learned,
        )

    def horizon(
        self,
        desired: ClusterSpec,
        memory: Memory,
        now: float,
        backoffs: list[float],
        wall: float,
    ) -> float | None:
        """When this judgement can next change with nothing observed changing."""
        return horizon(
            desired,
            memory,
            now,
            wall=wall,
            backoffs=backoffs,
            ray_unsettled=self.learned.ray_unsettled,
            load_mark=self.learned.load_mark,
            model_ready=self.learned.model_ready,
            hang_at=self.hang_at,
        )


def plan(
    desired: ClusterSpec,
    observed: Observed,
    memory: Memory,
    now: float,
    *,
    dry_run: bool = False,
    wall: float | None = None,
) -> Plan:
    """What to do about one look, and the spec its actions launch (chosen here, once)."""
    made = _decide(desired, observed, memory, now, dry_run=dry_run, wall=wall)
    return made.model_copy(update={"spec": rollout.acting_spec(desired, memory, made)})


def _decide(
    desired: ClusterSpec,
    observed: Observed,
    memory: Memory,
    now: float,
    *,
    dry_run: bool,
    wall: float | None,
) -> Plan:
    name = desired.name
    wall = now if wall is None else wall
    memory = bounded(memory, now)
    # While a rollback holds, the last-good spec stands in for the desired one
    # (core.deciding.rollout).
    steer = rollout.steer(desired, memory)
    desired = steer.spec
    if memory.paused is not None and memory.paused.active(wall):
        draft = _draft(desired, observed, memory, now)
        pause = memory.paused
        until = f" until {from_now(pause.until - wall)}" if pause.until is not None else ""
        return Plan(
            cluster=name,
            phase="paused",
            reason=f"paused by {pause.by}{until}: {pause.reason}",
            withheld=tuple(draft.actions),
            recheck_at=draft.horizon(desired, memory, now, [], wall),
            triage=draft.triage,
            learned=draft.learned,
        )
    if memory.blocked is not None:
        return Plan(
            cluster=name,
            phase="blocked",
            reason=f"{memory.blocked.reason} (latched; `sparkd resume {name}` to retry)",
        )
    draft = _draft(desired, observed, memory, now)
    failure = draft.failure or (acceptance.failed(observed.checks) if steer.may_roll_back else None)
    if failure is None and steer.may_roll_back:
        failure = rollout.output_fault(desired, observed, memory)
    if failure is None and (steer.may_roll_back or steer.held is not None):
        failure = _spent(draft, memory, desired, now)
    if draft.not_the_spec:
        # Neither a check nor a spent budget says the spec failed while a host is out of reach,
        # wedged or its fabric held: no rollback on it (a spent budget still latches below).
        failure = None
    rollback: str | None = None
    if failure is not None and steer.may_roll_back and steer.good is not None:
        rollback = failure
        draft = _rollback(steer, steer.good, observed, memory, now, failure)
    elif failure is not None and rollout.failed_rollback(steer, memory):
        return draft.blocked(name, rollout.latch_reason(steer, failure))
    elif steer.held is not None:
        _hold_back(draft, steer)
    if rollback is None and steer.held is None and rollout.prepare_due(desired, memory):
        _prepare(draft, desired, observed, steer.desired_hash)
    reset = draft.learned.serving_well and (
        memory.healthy_since is not None
        and now - memory.healthy_since >= desired.policy.healthy_reset
        and memory.backoff_reset_at < memory.healthy_since
    )
    # The gate first (core.deciding.gate): a refused action is withheld with the reason in place of
    # what proposed it, before any budget is counted or latched.
    judged = [(a, gate.refusal(draft.ctx, a)) for a in draft.actions]
    for action, refused in judged:
        if refused is not None:
            draft.reason = _refused(draft.reason, action, refused)
            draft.phase = "blocked" if refused.needs_a_human else draft.phase
    allowed: list[Action] = []
    withheld: list[Action] = []
    backoffs: list[float] = []
    gated: list[str] = []
    reason = draft.reason
    for action, refused in judged:
        if withheld or refused is not None:
            withheld.append(action)
            continue
        gated.append(action.key)
        used = policy.budget_used(memory, action.key, desired.policy, now)
        if used >= desired.policy.budget and action.kind == "prune_cache":
            # A cache entry that will not go is no reason to stop keeping the cluster alive.
            withheld.append(action)
            continue
        if used >= desired.policy.budget and not dry_run:
            return draft.blocked(name, _latch(action, memory, now, used))
        wait_until = policy.backoff_until(memory, action.key, desired.policy, now)
        if now < wait_until:
            withheld.append(action)
            backoffs.append(wait_until)
            reason = (
                f"{draft.reason}; backing off {action.kind} {action.target} on {action.host} "
                f"until {from_now(wait_until - now)}"
            )
            continue
        allowed.append(action)
    if dry_run:
        allowed, withheld, reason = [], allowed + withheld, f"dry-run: {reason}"
    return Plan(
        cluster=name,
        phase=draft.phase,
        reason=reason,
        actions=tuple(allowed),
        withheld=tuple(withheld + draft.withheld),
        recheck_at=draft.horizon(desired, memory, now, backoffs, wall),
        triage=draft.triage,
        rollback=rollback,
        gated=tuple(gated),
        learned=draft.learned.model_copy(update={"reset_backoff": reset}),
    )


def _refused(reason: str, action: Action, refused: gate.Refusal) -> str:
    """The plan's reason with the gate's refusal in place of the note that proposed it."""
    said = gate.note(action, refused)
    if action.reason and action.reason in reason:
        return reason.replace(action.reason, said, 1)
    return f"{said}; {reason}"


def _spent(draft: _Draft, memory: Memory, desired: ClusterSpec, now: float) -> str | None:
    """A model start whose budget is spent: the new spec (or the rollback) ran out of tries."""
    for action in draft.actions:
        if action.kind not in MODEL_STARTS or gate.refusal(draft.ctx, action) is not None:
            continue
        used = policy.budget_used(memory, action.key, desired.policy, now)
        if used >= desired.policy.budget:
            return _latch(action, memory, now, used)
    return None


def _rollback(
    steer: rollout.Steer,
    good: ClusterSpec,
    observed: Observed,
    memory: Memory,
    now: float,
    why: str,
) -> _Draft:
    """The new spec failed: the last-good spec is launched instead (Ray first, if its spec
    differs), whatever the failed launch's evidence would have had retried."""
    back = _draft(good, observed, memory, now)
    back.reason = f"rolling back from {steer.desired_hash} to {steer.good_hash}: {why}"
    # Its own budget: the failed spec's attempts (maybe all of them) are not the rollback's.
    back.actions = [
        a.model_copy(update={"subject": f"{a.target} rollback to {steer.good_hash}"})
        if a.kind in MODEL_STARTS
        else a
        for a in back.actions
    ]
    back.phase = "starting_ray" if back.phase == "starting_ray" else "starting_model"
    return back


def _prepare(draft: _Draft, desired: ClusterSpec, observed: Observed, spec: str) -> None:
    """Nothing is stopped or launched for a spec whose model files are not whole on the head
    (core.judging.weights): the old deployment keeps serving, and a first one is not launched into a
    certain failure. Not latched: read again each cycle, cut over once the files are there."""
    if weight_files.host_path(desired) is None:
        return
    head = observed.host(desired.head.name)
    files = head.model_files if head is not None else None
    if files is None:
        return
    why = weights.unready(files)
    held = [a for a in draft.actions if a.kind in STOPS]
    if why is None or not held:
        return
    draft.actions = [a for a in draft.actions if a.kind not in STOPS]
    draft.phase = "blocked"
    draft.reason = f"rollout of {spec} waits: {why}; {draft.reason}"


def _hold_back(draft: _Draft, steer: rollout.Steer) -> None:
    """Held on the last-good spec: `degraded` once it serves, and the reason says why."""
    held = steer.held
    text = steer.rollback_reason(held.rolled_back or "" if held is not None else "")
    if draft.phase in ("healthy", "degraded") and not draft.actions:
        was = draft.reason if draft.phase == "degraded" else ""
        draft.phase = "degraded"
        draft.reason = f"{text}; {was}" if was else text
    else:
        draft.reason = f"{text}; {draft.reason}"


def _draft(desired: ClusterSpec, observed: Observed, memory: Memory, now: float) -> _Draft:
    # What memory knows of an older serve process says nothing about the one running now.
    memory = of_this_launch(memory, observed)
    # An adopted deployment is judged as sparkd's own (core.judging.adopt).
    adoption_over = adopt.gone(observed, memory)
    observed = adopt.as_ours(desired, observed, memory)
    ctx = Context.of(desired, observed, memory, now)
    endpoint = observed.endpoint
    serving = ctx.head_reachable and endpoint is not None and endpoint.serves(ctx.model_name)
    # A server that answers HTTP but refuses sparkd's key has finished loading.
    answering = endpoint is not None and endpoint.status == "http_error"
    load = assess(ctx, serving or answering)
    reach = judge_reachability(ctx)
    fabric = judge_fabric(ctx)
    wedged = judge_wedged(ctx, load, fabric_sound=not fabric.triage)
    pressure = judge_memory(ctx, load)
    cleanup = judge_cleanup(ctx)
    images = judge_images(ctx)
    ray = judge_ray(ctx, images, load, serving)
    recovery = judge_recovery(ctx, fabric, ray_busy=bool(ray.actions))
    model = judge_model(ctx, ray, load, serving, images)
    stages: list[Verdict] = [reach, wedged, pressure, fabric, cleanup, images, ray, recovery, model]
    notes = [f"{host} rebooted (boot id changed)" for host in policy.rebooted(observed, memory)]
    probe_failures: int | None = None
    busy: int | None = None
    unknown: int | None = None
    restarts: list[Action] = []
    # The token counter is followed only while the model is past its load.
    token_mark = track(ctx) if model.to_probe else None
    if model.to_probe:
        probed = judge_probe(ctx, load, serving, ray.link_problems)
        stages.append(probed)
        hung = judge_hang(ctx, token_mark)
        if any(a.kind == "restart_model" for a in probed.actions):
            hung.actions.clear()  # one restart, however many reasons
        stages.append(hung)
        restarts = [a for a in (*probed.actions, *hung.actions) if a.kind == "restart_model"]
        if observed.probe is not None and policy.is_new_probe(memory, observed.probe):
            probe_failures = policy.failures_after(memory, observed.probe)
            busy = policy.busy_streak_after(memory, observed.probe)
            unknown = policy.unknown_streak_after(memory, observed.probe)
    contact = adopt.judge(ctx, serving)
    holds = [hold for stage in stages for hold in stage.holds] + contact.holds
    # A failure counts against the spec only through a restart that survives the vetoes, and
    # never while a host is out of reach, wedged or its fabric is down: that is not the spec.
    failing = [*restarts, *(a for a in model.actions if a.reason == model.failed)]
    # Nor through one the gate refuses: what it withholds was not shown to be the spec's fault.
    failure = next(
        (a.reason for a in failing if _veto(a, holds) is None and gate.refusal(ctx, a) is None),
        None,
    )
    not_the_spec = bool(reach.holds or wedged.holds or fabric.holds)
    if not_the_spec:
        failure = None
    actions: list[Action] = []
    held: list[str] = []
    for stage in stages:
        notes.extend(stage.notes)
        for action in stage.actions:
            veto = _veto(action, holds)
            if veto is None:
                actions.append(action)
            elif veto.reason not in held:
                held.append(veto.reason)
    notes.extend(f"holding back: {why}" for why in held if not any(why in n for n in notes))
    phase = _phase(stages)
    preview: list[Action] = []
    if contact.note is not None:
        phase, preview, actions = _first_contact(contact, stages, phase, actions)
        notes = [contact.note] if contact.found is not None else [contact.note, *notes]
    elif memory.adopted is not None and not adoption_over:
        actions = adopt.replacing(desired, memory, actions)
    if phase == "healthy" and not actions:
        # Housekeeping only while all is well: the serve process is then the desired one.
        pruning, note = judge_cache(desired, ctx.facts)
        actions.extend(pruning)
        notes.append(note)
    failures = probe_failures if probe_failures is not None else memory.consecutive_failures
    latest = observed.probe or memory.last_probe
    answered = latest is not None and (latest.verdict.healthy is True or latest.busy)
    found = tuple(dict.fromkeys(t for stage in stages for t in stage.triage))
    # Health that lasts closes an incident: healthy, or degraded only while the model serves and
    # answers (busy, a dead data link, Ray unread) with no failure counted.
    serving_well = (
        contact.adopt is not None
        or phase == "healthy"
        or (
            phase == "degraded"
            and serving
            and model.to_probe
            and not actions
            and failures == 0
            and answered
        )
    )
    learned = Learned(
        model_ready=contact.adopt is not None or (model.to_probe and (serving or load.was_ready)),
        ray_unsettled=ray.unsettled or model.waiting,
        ray_ready=ray.ready,
        load_mark=load.mark if not load.was_ready else None,
        probe_failures=probe_failures,
        busy_streak=busy,
        unknown_streak=unknown,
        serving_well=serving_well,
        fabric_held=bool(fabric.holds),
        memory_held=model.memory_held,
        token_mark=token_mark,
        adopted=contact.adopt,
        adoption_over=adoption_over,
        adopting=contact.adopting,
    )
    return _Draft(
        phase=phase,
        reason="; ".join(_unique(notes)) or "nothing to do",
        ctx=ctx,
        learned=learned,
        actions=actions,
        triage=found,
        failure=failure,
        not_the_spec=not_the_spec,
        hang_at=deadline(ctx, token_mark),
        withheld=preview,
    )


def _first_contact(
    contact: adopt.AdoptVerdict, stages: list[Verdict], phase: Phase, actions: list[Action]
) -> tuple[Phase, list[Action], list[Action]]:
    """The phase, the rollout shown (withheld) and the actions of a first contact with a
    deployment made by hand (core.judging.adopt): adopted, adopting, shown, or replaced."""
    if contact.adopt is not None:
        return "healthy", [], []
    if contact.removals:
        # The operator decided: the hand-made containers go first, the launch on a later look.
        return "cleaning", [], list(contact.removals)
    if contact.found is None:
        return phase, [], actions
    if contact.differences:
        # What a rollout to the config would do: the hand-made containers removed, then what
        # the stages would launch in their place.
        found = contact.found
        rollout = [
            Action(
                kind="remove_container",
                host=host,
                target=box.name,
                reason=f"{box.name}: would be replaced by the config's launch",
            )
            for host, box in found.ray.items()
            if box is not None
        ]
        launched = [a for stage in stages for a in stage.actions if a.kind != "kill_gpu_process"]
        return "blocked", rollout + launched, []
    return "probing", [], []


def _latch(action: Action, memory: Memory, now: float, used: int) -> str:
    """Why the cluster latches, from the evidence: what was fought, how often and for how
    long, what for, and which hosts kept dropping out meanwhile."""
    attempts = policy.incident(memory, action.key)
    since = attempts[0].at if attempts else now
    why = f"last: {action.reason}"
    before = attempts[-1].reason if attempts else ""
    if before and before != action.reason:
        why += f"; before that: {before}"
    for host, times in sorted(memory.went_unreachable.items()):
        lost = [t for t in times if t >= memory.backoff_reset_at]
        if len(lost) > 1:
            why += f"; {host} unreachable {len(lost)} times in {ago(now - lost[0])}"
    return (
        f"budget spent: {action.kind} {action.target} on {action.host} ran {used} times in "
        f"{ago(now - since)} without lasting health ({why}); not fighting it any longer"
    )


def _veto(action: Action, holds: list[Hold]) -> Hold | None:
    return next((hold for hold in holds if hold.vetoes(action)), None)


def _phase(stages: list[Verdict]) -> Phase:
    named = [stage.phase for stage in stages if stage.phase is not None]
    if not named:
        return "degraded"
    return min(named, key=STAGE_ORDER.index)


def _unique(notes: list[str]) -> list[str]:
    return [n for n in dict.fromkeys(notes) if n]
