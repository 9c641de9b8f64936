"""One controller per cluster: observe, plan, execute, remember, record; one cycle at a time.

A cycle starts when the controller's event is set: by its own timer (the interval, or the
recheck interval while work is in progress), by an operator (`reconcile`, `resume`), never
back to back. Clusters are independent tasks; one cluster's slowness never delays another.

Memory and events are persisted as each action finishes, not only at the end of the cycle: a
crash mid-cycle loses nothing already done, and the budget is charged for it (an action is
charged before it starts, so one a crash cuts short counts as tried too). When the state
dir cannot be written (a full disk), memory stays in the process, events wait in a bounded
queue, each failure is logged, and the gap is recorded as an event once writing works again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkd.core import hang, rollout
from sparkd.core.clock import STEP_NOTICED, bounded
from sparkd.core.planner import plan as make_plan
from sparkd.core.policy import is_new_probe, rebooted
from sparkd.core.ray_stage import needs_ray_status
from sparkd.core.remember import intend, remember
from sparkd.core.remember import pause as pause_memory
from sparkd.core.remember import resume as resume_memory
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import MEMORY_VERSION, Memory, Pause
from sparkd.model.observed import ModelEndpoint, Observed, RayState
from sparkd.model.plan import Action, ActionOutcome, Plan
from sparkd.model.probe import ProbeOutcome, ProbeResult
from sparkd.runtime import logs
from sparkd.runtime.clock import DaemonClock, elapsed, ops_boot_id
from sparkd.runtime.maintenance import Window, window_at
from sparkd.runtime.state import StateDir
from sparkd.runtime.store import LocalStore, MemoryStore
from sparkd.shell.events import EventWatch
from sparkd.shell.execute import Executor, ExecutorTiming
from sparkd.shell.fencing import HostFence
from sparkd.shell.observe import observe, observe_timeout
from sparkd.shell.ssh import SshPool

# "unreachable": a host coming back is seen within a recheck (its event stream, lost with it,
# has nothing to say until it is set up again).
WORK_IN_PROGRESS = frozenset(
    {"unreachable", "cleaning", "starting_ray", "starting_model", "loading", "probing"}
)
RECENT_ACTIONS = 50
EVENTS_KEPT = 1000
# Events held in the process while the state dir cannot be written; past this the oldest go
# (counted, logged, and recorded once writing works again).
UNSAVED_EVENTS_KEPT = 1000
# The reasoning-only ratio is taken over this many of the latest healthy probes.
PROBE_WINDOW = 20


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


# The rollout events that are a rollout's result (sparkd_rollouts_total{result}).
RESULT_OF = {
    "rollout_accepted": "accepted",
    "rolled_back": "rolled_back",
    "rollback_failed": "rollback_failed",
}


@dataclass
class _Cycle:
    """The cycle in progress, so that each finished action can be learnt and persisted."""

    before: Memory
    observed: Observed
    plan: Plan
    events: list[dict[str, Any]]
    outcomes: list[ActionOutcome] = field(default_factory=list)
    blocked_noted: bool = False
    rollout_noted: set[str] = field(default_factory=set)


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


class Controller:
    def __init__(
        self,
        cluster: ClusterSpec,
        pool: SshPool,
        state: StateDir,
        *,
        dry_run: bool = False,
        executor_timing: ExecutorTiming | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = elapsed,
        boot_id: str | None = None,
        on_cycle: Callable[[Controller], None] = lambda c: None,
        on_action: Callable[[Controller, ActionOutcome], None] = lambda c, o: None,
        on_plan: Callable[[Controller], None] = lambda c: None,
        watch_events: bool = True,
        on_record: Callable[[Controller, CycleRecord], None] = lambda c, r: None,
        may_act: Callable[[], bool] = lambda: True,
        fence: HostFence | None = None,
        store: MemoryStore | None = None,
    ) -> None:
        self.cluster = cluster
        self.pool = pool
        self.state = state
        self.dry_run = dry_run
        self.wall_clock = wall_clock
        self.monotonic = monotonic
        self.on_cycle = on_cycle
        self.on_action = on_action
        self.on_plan = on_plan
        self.watch_events = watch_events
        self.on_record = on_record
        # False while another instance owns the cluster (HA): observe and export, never act.
        self.may_act = may_act
        # HA: mutating commands carry the owner's token; hosts are swept before any action.
        self.fence = fence
        self.view = ClusterView()
        self.wake = asyncio.Event()
        self.stopping = False
        self.log = logs.get().bind(cluster=cluster.name)
        # HA: memory in etcd, written by the owner only; else the state dir.
        self.store = store or LocalStore(state)
        read = self.store.read(cluster.name, wall_clock())
        self.clock = DaemonClock(
            wall_clock,
            monotonic,
            ops_boot_id() if boot_id is None else boot_id,
            read.memory.clock,
        )
        self.executor = Executor(
            cluster,
            pool,
            timing=executor_timing or ExecutorTiming(),
            wall_clock=self.clock.now,
            on_start=self._action_started,
            on_finish=self._action_finished,
            fence=fence,
            ready=lambda action: self.store.ready(self.cluster.name, action),
        )
        # Persisting: the latest error (None while writes succeed), since when, and the
        # events not yet written.
        self.persist_error: str | None = None
        self.persist_failed_since: float | None = None
        self._unsaved: list[dict[str, Any]] = []
        self._unsaved_dropped = 0
        self._cycle: _Cycle | None = None
        # Something since the last cycle may have changed Ray (an event, an operator's ask).
        self._stirred = True
        self._ray_read_at: float | None = None
        if read.ignored or read.version > MEMORY_VERSION:
            self.log.warning(
                "memory_newer_version", version=read.version, ignored=list(read.ignored)
            )
        # A stamp from before a reboot of the ops box may lie ahead of the new daemon time.
        self.memory: Memory = bounded(read.memory, self.clock.now()).evolve(clock=self.clock.anchor)
        if not self.clock.carried:
            if read.memory.clock is not None:
                self.log.warning("clock_anchor_reset", why="ops box rebooted; wall clock taken")
            if not dry_run:
                # At once: a restart before the first cycle ends must find the same anchor.
                self._persist([])
        if read.problem is not None and read.memory.blocked is not None:
            self.log.error("memory_unreadable", problem=read.problem)
            self._persist([self._event("blocked", reason=read.memory.blocked.reason)])
        # Progress for the watchdog and /healthz: a cycle finished, or an action is running.
        self.progress_at = monotonic()
        self.action_deadline: float | None = None
        # While a look runs: when it must have ended, by its own timeouts.
        self.observe_deadline: float | None = None
        self._operator_edits: list[Callable[[Memory], Memory]] = []

    # -- one cycle ----------------------------------------------------------------------

    def _probe_due(self, endpoint: ModelEndpoint) -> bool:
        if hang.stands(self.cluster, self.memory, endpoint, self.clock.now()):
            # The plan restarts a hung engine on this reading: a probe would only hold the
            # look up for its whole timeout first.
            return False
        ready_before = self.memory.model_ready_at is not None
        if endpoint.status != "up" and not ready_before:
            return False
        # The first probe of a launch goes as soon as the model answers; then every interval.
        last = self.memory.last_probe_at
        if self.memory.last_probe is None or last is None:
            return True
        return self.clock.now() - last >= self.cluster.probe_interval

    def _reusable_ray(self) -> RayState | None:
        """Ray's last reading, when it may stand in for a `ray` call (0.6-3 s of a core on the
        head each): the cluster is converged, nothing since stirred it (no event, no operator,
        no failed cycle), and Ray was read within a probe interval, so Ray is still verified
        at least as often as the model is probed."""
        plan, seen = self.view.plan, self.view.snapshot
        if self._stirred or self.view.last_error is not None or plan is None:
            return None
        if not plan.converged or seen is None or seen.ray is None or not seen.ray.up:
            return None
        read_at = self._ray_read_at
        if read_at is None or self.clock.now() - read_at >= self.cluster.probe_interval:
            return None
        return seen.ray

    async def cycle(self) -> Plan:
        started = self.monotonic()
        # A ready Ray needs one `ray` call a look at most (none while its last reading stands);
        # one that is getting there also reads `ray status` (core.ray_stage.needs_ray_status).
        ray_status = needs_ray_status(self.view.plan)
        known_ray = self._reusable_ray()
        self._stirred = False
        swept = None
        if self.fence is not None and self.may_act() and not self.dry_run:
            # A new owner's first step, before it looks: the former owner's commands still
            # running on a host finish first, and any later one of its is refused there.
            await self._adopt()
            await self.fence.sweep()
            swept = self.fence.token()
        # A hung host makes a look last up to its command timeout, which may be several
        # intervals: within its own bound that is progress, so the watchdog keeps the daemon
        # (and every other cluster) running.
        self.observe_deadline = self.monotonic() + observe_timeout(self.cluster)
        try:
            # While a rollback holds, the last-good spec is the one observed (its log, its key).
            observed = await observe(
                rollout.steer(self.cluster, self.memory).spec,
                self.pool,
                probe_due=self._probe_due,
                wall_clock=self.clock.now,
                ray_status=ray_status,
                known_ray=known_ray,
                checks_due=rollout.checks_due(self.cluster, self.memory),
                prepare=rollout.prepare_due(self.cluster, self.memory),
            )
        finally:
            self.observe_deadline = None
        if known_ray is None:
            self._ray_read_at = observed.observed_at
        self.progress_at = self.monotonic()  # a slow but bounded observation is progress
        self._operator_edits.clear()
        self._note_step()
        before = self.memory
        wall = self.clock.wall_of(observed.observed_at)
        effective = self._effective(before, wall)
        plan = make_plan(
            self.cluster,
            observed,
            effective,
            observed.observed_at,
            dry_run=self.dry_run,
            wall=wall,
        )
        # A rollback launches the last-good spec: the executor builds its commands from it.
        self.executor.cluster = rollout.acting_spec(self.cluster, effective, plan)
        if plan.reason != before.last_reason or plan.phase != before.last_phase:
            self.log.info("plan", phase=plan.phase, reason=plan.reason, actions=len(plan.actions))
        rebooted_hosts = rebooted(observed, before)
        events = self._reboot_events(rebooted_hosts)
        if plan.phase != before.last_phase:
            events.append(
                self._event("phase", phase=plan.phase, was=before.last_phase, reason=plan.reason)
            )
        self.view.snapshot = observed
        self.view.plan = plan
        self.on_plan(self)
        cycle = _Cycle(before=before, observed=observed, plan=plan, events=events)
        self._cycle = cycle
        try:
            if plan.actions and not self.stopping and self.may_act():
                if self.fence is None or (swept is not None and swept == self.fence.token()):
                    await self.executor.run(plan, should_stop=self._hold_actions)
                else:
                    # Owner since the look began: this look may predate a former owner's last
                    # command. Sweep and look again first (at once: the loop sees it acted).
                    self.log.info("fence_sweep_first", reason="became owner during the look")
        finally:
            self._cycle = None
        outcomes = cycle.outcomes
        self._learn(cycle)
        self._operator_edits.clear()
        self.view.snapshot = observed
        self.view.plan = plan
        self.view.cycles += 1
        self.view.last_cycle_at = self.wall_clock()
        self.view.last_error = None
        self.view.in_flight = None
        self.action_deadline = None
        self.progress_at = self.monotonic()
        probe = observed.probe if is_new_probe(before, observed.probe) else None
        if probe is not None and probe.verdict.healthy:
            self.view.probe_window.append(probe.outcome)
            self.view.last_probe_success_at = self.clock.wall_of(probe.at)
        self.on_cycle(self)
        self.on_record(
            self,
            CycleRecord(
                ok=True,
                seconds=self.monotonic() - started,
                observed=observed,
                plan=plan,
                probe=probe,
                rebooted=tuple(rebooted_hosts),
                outcomes=tuple(outcomes),
                rollout_results=tuple(
                    RESULT_OF[kind] for kind in cycle.rollout_noted if kind in RESULT_OF
                ),
            ),
        )
        return plan

    async def _adopt(self) -> None:
        """A new owner continues from the store's memory; the former owner's last action, if
        its outcome never landed, is only known from the look that follows."""
        adopted = await self.store.adopt(self.cluster.name, self.memory, self.clock.now())
        if adopted is not None:
            self.memory = bounded(adopted.memory, self.clock.now()).evolve(clock=self.clock.anchor)
            unknown = (
                [self._event("intent_unknown", intent=adopted.intent)] if adopted.intent else []
            )
            self._persist([self._event("memory_adopted", source=adopted.source), *unknown])
            await self.store.continued(self.cluster.name)

    def _note_step(self) -> None:
        """Log a wall-clock step once, when it first shows or changes; show it in the view.
        Nothing is decided on it: durations are daemon time, a pause's end is wall clock."""
        step = self.clock.noticed()
        was = self.view.clock_step
        if abs((step or 0.0) - (was or 0.0)) >= STEP_NOTICED:
            if step is None:
                self.log.info("clock_step_gone", was=round(was or 0.0, 3))
            else:
                self.log.warning(
                    "clock_step",
                    seconds=round(step, 3),
                    note="durations run on the monotonic clock; pauses and windows on the wall",
                )
            self.view.clock_step = step

    def _learn(self, cycle: _Cycle) -> None:
        """Memory as if the cycle ended now, persisted with the events so far."""
        now = self.clock.now()
        self.memory = remember(
            cycle.before,
            cycle.observed,
            cycle.outcomes,
            now,
            cycle.plan,
            wall=self.clock.wall_of(now),
        )
        self.memory = rollout.track(
            cycle.before,
            self.memory,
            self.cluster,
            cycle.observed,
            cycle.outcomes,
            cycle.plan,
            now,
            self.clock.wall_of(now),
        )
        for kind, fields in rollout.events(cycle.before.rollout, self.memory.rollout):
            if kind not in cycle.rollout_noted:
                cycle.rollout_noted.add(kind)
                cycle.events.append(self._event(kind, **fields))
                self.log.warning(kind, **fields)
        # A pause or resume that landed while the cycle ran applies on top of what it learnt.
        for edit in self._operator_edits:
            self.memory = edit(self.memory)
        blocked = self.memory.blocked
        if blocked is not None and cycle.before.blocked is None and not cycle.blocked_noted:
            cycle.blocked_noted = True
            cycle.events.append(self._event("blocked", reason=blocked.reason))
            self.log.error("blocked", reason=blocked.reason)
        events, cycle.events = cycle.events, []
        if not self.dry_run:  # a dry run changes nothing, its own state included
            self._persist(events)

    def _persist(self, events: list[dict[str, Any]]) -> bool:
        """Write memory and events; on failure keep them in the process, log, and say so.
        True when everything is on disk."""
        self._unsaved.extend(events)
        if len(self._unsaved) > UNSAVED_EVENTS_KEPT:
            lost = self._unsaved[:-UNSAVED_EVENTS_KEPT]
            self._unsaved = self._unsaved[-UNSAVED_EVENTS_KEPT:]
            self._unsaved_dropped += len(lost)
            self.log.error(
                "events_dropped",
                count=len(lost),
                kinds=sorted({str(e.get("kind")) for e in lost}),
                reason="state dir not writable",
            )
        gap = [self._persist_gap_event()] if self.persist_error is not None else []
        try:
            self.store.save(self.cluster.name, self.memory)
            self.state.append_events(gap + self._unsaved, keep=EVENTS_KEPT)
        except OSError as exc:
            error = f"{self.state.path}: {exc.strerror or exc}"
            if self.persist_error is None:
                self.persist_failed_since = self.wall_clock()
            self.persist_error = error
            self.log.error(
                "persist_failed",
                error=error,
                unsaved_events=len(self._unsaved),
                kinds=sorted({str(e.get("kind")) for e in events}),
            )
            return False
        if self.persist_error is not None:
            self.log.warning("persist_recovered", was=self.persist_error)
        self._unsaved = []
        self._unsaved_dropped = 0
        self.persist_error = None
        self.persist_failed_since = None
        return True

    def _persist_gap_event(self) -> dict[str, Any]:
        return self._event(
            "persist_gap",
            since=self.persist_failed_since,
            error=self.persist_error,
            dropped_events=self._unsaved_dropped,
        )

    def maintenance_at(self, now: float) -> Window | None:
        return window_at(self.cluster.maintenance, now)

    def _effective(self, memory: Memory, now: float) -> Memory:
        """Memory as the planner sees it: inside a maintenance window, paused by the window
        (an operator's own pause stays as it is). Never remembered: the window decides."""
        if memory.paused is not None and memory.paused.active(now):
            return memory
        window = self.maintenance_at(now)
        if window is None:
            return memory
        pause = Pause(
            reason=window.reason, by="maintenance window", since=window.start, until=window.end
        )
        return memory.evolve(paused=pause)

    def _hold_actions(self) -> bool:
        """Stop before the next action: shutting down, or paused (by an operator or a window)
        meanwhile. The action already running finishes."""
        now = self.wall_clock()
        paused = self.memory.paused
        return (
            self.stopping
            or not self.may_act()
            or (paused is not None and paused.active(now))
            or self.maintenance_at(now) is not None
        )

    def _action_started(self, action: Action) -> None:
        self.view.in_flight = action
        self.progress_at = self.monotonic()
        self.action_deadline = self.monotonic() + self.executor.action_timeout(action)
        self.log.info("action_start", action=action.kind, host=action.host, target=action.target)
        if self._cycle is not None and not self.dry_run:
            # On disk before the remote command is sent: killed mid-action, the next process
            # still counts this attempt against the budget and backs off from it.
            self.memory = intend(self.memory, action.key, self.clock.now(), action.reason)
            self._persist([])

    def _action_finished(self, outcome: ActionOutcome) -> None:
        self.store.settled(self.cluster.name)
        self.view.recent.appendleft(outcome)
        self.view.in_flight = None
        self.action_deadline = None
        self.progress_at = self.monotonic()
        cycle = self._cycle
        if cycle is not None:
            cycle.outcomes.append(outcome)
            cycle.events.append(
                self._event(
                    "remediation",
                    action=outcome.action.kind,
                    host=outcome.action.host,
                    target=outcome.action.target,
                    result=outcome.result,
                    reason=outcome.action.reason,
                    detail=outcome.detail,
                )
            )
            self._learn(cycle)
        log = self.log.info if outcome.result == "ok" else self.log.warning
        log(
            "action",
            action=outcome.action.kind,
            host=outcome.action.host,
            target=outcome.action.target,
            result=outcome.result,
            detail=outcome.detail,
            seconds=round(outcome.finished_at - outcome.started_at, 3),
        )
        self.on_action(self, outcome)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"at": self.wall_clock(), "cluster": self.cluster.name, "kind": kind, **fields}

    def _reboot_events(self, hosts: list[str]) -> list[dict[str, Any]]:
        events = []
        for host in hosts:
            self.log.warning("reboot_detected", host=host)
            events.append(self._event("reboot", host=host))
        return events

    def next_delay(self) -> float:
        """How long until the next look with no event: the interval when converged, the recheck
        interval while work is in progress, or sooner when the plan's horizon (a backoff, a
        deadline, a probe due, a maintenance window's end) comes first."""
        plan = self.view.plan
        if plan is None or self.view.last_error is not None:
            return self.cluster.recheck_interval
        if plan.actions or plan.phase in WORK_IN_PROGRESS:
            delay = self.cluster.recheck_interval
        else:
            delay = self.cluster.interval
        now = self.clock.now()
        wall = self.wall_clock()
        window_end = self._window_end(wall)
        ahead = [
            t
            for t in (plan.recheck_at, None if window_end is None else now + window_end - wall)
            if t is not None
        ]
        if ahead:
            # Just past the deadline: the planner's limits are strict (`> load_stall`). One
            # that passed while this cycle ran (a look held up by a probe's timeout) is due now,
            # not an interval later.
            due = min(ahead)
            margin = 0.01 * self.cluster.recheck_interval
            delay = min(delay, due - now + margin if due > now else 0.0)
        return delay

    def _window_end(self, now: float) -> float | None:
        window = self.maintenance_at(now)
        return window.end if window is not None else None

    # -- the loop -----------------------------------------------------------------------

    def _woken(self, host: str, why: str) -> None:
        """A host's event stream says something changed: look again now (coalesced: one wake
        covers every event until the next cycle starts)."""
        if not self.wake.is_set():
            self.log.info("woken", host=host, why=why)
        self._stirred = True
        self.wake.set()

    async def run(self) -> None:
        watch = EventWatch(self.cluster, self.pool, self._woken) if self.watch_events else None
        if watch is not None:
            watch.start()
        try:
            await self._loop()
        finally:
            if watch is not None:
                await watch.stop()

    async def _loop(self) -> None:
        while not self.stopping:
            self.wake.clear()
            started = self.monotonic()
            acted = False
            try:
                plan = await self.cycle()
                acted = bool(plan.actions) and self.may_act()
            except Exception as exc:  # a cycle must never kill the controller
                self.view.last_error = f"{type(exc).__name__}: {exc}"
                self.view.in_flight = None
                self.action_deadline = None
                # The loop goes on: for the watchdog that is progress; /healthz names it.
                self.progress_at = self.monotonic()
                self.log.exception("cycle_failed")
                self.on_record(self, CycleRecord(ok=False, seconds=self.monotonic() - started))
            if self.stopping:
                break
            if acted:
                # What the actions did is worth seeing now, not a recheck later; budget and
                # backoff bound how often that can happen.
                continue
            ended = self.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.next_delay())
            # Never back to back on wake-ups: a burst of events waits a little after the last
            # cycle, and is then seen by one look.
            floor = min(0.1 * self.cluster.recheck_interval, 1.0)
            rest = floor - (self.monotonic() - ended)
            if rest > 0 and not self.stopping:
                await asyncio.sleep(rest)

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()

    def healthy(self, now: float) -> tuple[bool, str]:
        """Making progress: a cycle finished within 3 intervals, or a look or an action runs
        within its own timeouts."""
        if self.action_deadline is not None:
            if now <= self.action_deadline:
                return True, "action in progress"
            return False, "action overran its timeout"
        if self.observe_deadline is not None:
            if now <= self.observe_deadline:
                return True, "observing"
            return False, "observation overran its timeouts"
        age = now - self.progress_at
        if age <= 3 * self.cluster.interval:
            return True, "ok"
        return False, f"no cycle finished for {age:.0f}s"

    # -- operator requests --------------------------------------------------------------

    def _edit(self, edit: Callable[[Memory], Memory]) -> None:
        self.memory = edit(self.memory)
        self._operator_edits.append(edit)

    def pause(self, reason: str, by: str, until: float | None) -> bool:
        """Applied at once; True when it is also on disk."""
        now = self.wall_clock()
        self._edit(lambda m: pause_memory(m, reason=reason, by=by, now=now, until=until))
        self.log.info("paused", by=by, reason=reason, until=until)
        saved = self._persist([self._event("paused", by=by, reason=reason, until=until)])
        self.wake.set()
        return saved

    def resume(self, by: str) -> bool:
        """Applied at once; True when it is also on disk."""
        self._edit(resume_memory)
        self.log.info("resumed", by=by)
        saved = self._persist([self._event("resumed", by=by)])
        self.wake.set()
        return saved

    def fenced(self, host: str, detail: str) -> None:
        """A host refused this instance's token (HA): another instance owns the cluster now.
        The action is skipped (no budget spent); ownership is already given up."""
        self.log.warning("fenced", host=host, detail=detail)
        self._persist([self._event("fenced", host=host, detail=detail)])
        self.wake.set()

    def rollout_retry(self, by: str) -> bool:
        """Roll the desired spec out again after a rollback; False when none holds."""
        if self.memory.rollout is None or self.memory.rollout.rolled_back is None:
            return False
        self._edit(rollout.retry)
        self.log.info("rollout_retry", by=by)
        self._persist([self._event("rollout_retry", by=by)])
        self.wake.set()
        return True

    def rollout_back(self, by: str) -> bool:
        """Go to the last-good spec now; False when there is none other than the desired."""
        cluster, now, wall = self.cluster, self.clock.now(), self.wall_clock()
        edited = rollout.back(self.memory, cluster, by, now, wall)
        if edited == self.memory:
            return False
        self._edit(lambda m: rollout.back(m, cluster, by, now, wall))
        self.log.info("rollout_back", by=by)
        self._persist([self._event("rollout_back", by=by)])
        self.wake.set()
        return True

    def reconcile(self, by: str) -> None:
        self.log.info("reconcile_requested", by=by)
        self._stirred = True
        self.wake.set()
