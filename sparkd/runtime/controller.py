"""One controller per cluster: observe, plan, execute, remember, record; one cycle at a time.

A cycle starts when the controller's event is set: by its own timer (runtime.next_look), by an
operator (runtime.requests), never back to back. Clusters are independent tasks; one cluster's
slowness never delays another.

Memory and events are persisted as each action finishes, not only at the end of the cycle
(runtime.persist): a crash mid-cycle loses nothing already done, and the budget is charged for
it (an action is charged before it starts, so one a crash cuts short counts as tried too).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from sparkd.core.clock import bounded
from sparkd.core.deciding import known_specs, rollout
from sparkd.core.deciding.planner import plan as make_plan
from sparkd.core.judging.ray_stage import needs_ray_status
from sparkd.core.policy import is_new_probe, rebooted
from sparkd.core.remembering import rollout_record
from sparkd.core.remembering.remember import after_cycle, intend
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import MEMORY_VERSION, Memory
from sparkd.model.observed import ModelEndpoint, Observed
from sparkd.model.plan import Action, ActionOutcome, Plan
from sparkd.runtime import logs
from sparkd.runtime.clock import DaemonClock, elapsed, note_step, ops_boot_id
from sparkd.runtime.cluster_view import (
    RESULT_OF,
    ClusterView,
    CycleInProgress,
    CycleRecord,
    liveness,
)
from sparkd.runtime.maintenance import Window, overlay, window_at
from sparkd.runtime.next_look import NextLook, next_look, wake_rest
from sparkd.runtime.persist import Persistence
from sparkd.runtime.reads import probe_due, reusable_ray
from sparkd.runtime.requests import MemoryNow, OperatorRequests
from sparkd.runtime.spec_history import SpecHistory
from sparkd.runtime.state import StateDir
from sparkd.runtime.store import LocalStore, MemoryStore
from sparkd.shell.events import EventWatch, HostEvents
from sparkd.shell.execute import Executor, ExecutorTiming
from sparkd.shell.fencing import HostFence
from sparkd.shell.observe import observe, observe_timeout
from sparkd.shell.ssh import SshPool

# ClusterView and CycleRecord live in runtime.cluster_view; named here too, beside the controller.


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
        # Per host, what its `docker events` stream did (shell.events): for the metrics.
        self.event_counts: dict[str, HostEvents] = {}
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
        self.persistence = Persistence(
            state, cluster.name, self.log, wall_clock, self._event, store=self.store
        )
        self._cycle: CycleInProgress | None = None
        # The dashboard's last refusal said in the log: once when it starts or changes, not
        # every cycle (each snapshot and /status carry it while it lasts).
        self._dashboard_refused: str | None = None
        # Something since the last cycle may have changed Ray (an event, an operator's ask).
        self._stirred = True
        self._ray_read_at: float | None = None
        if read.ignored or read.version > MEMORY_VERSION:
            self.log.warning(
                "memory_newer_version", version=read.version, ignored=list(read.ignored)
            )
        # A stamp from before a reboot of the ops box may lie ahead of the new daemon time.
        # Memory from the state dir is another process's: evidence until this one confirms it.
        self.now = MemoryNow(
            bounded(read.memory, self.clock.now()).evolve(
                clock=self.clock.anchor, observing_since=self.clock.now()
            )
        )
        self.requests = OperatorRequests(
            self.now,
            lambda: self.cluster,
            self.clock,
            wall_clock,
            self.log,
            self._note,
            self._stir,
        )
        if not self.clock.carried:
            if read.memory.clock is not None:
                self.log.warning("clock_anchor_reset", why="ops box rebooted; wall clock taken")
            if not dry_run:
                # At once: a restart before the first cycle ends must find the same anchor.
                self._persist([])
        if read.problem is not None and read.memory.blocked is not None:
            self.log.error("memory_unreadable", problem=read.problem)
            self._persist([self._event("blocked", reason=read.memory.blocked.reason)])
        # The specs this box's configs ran: the only ones a rollback may launch. A state dir
        # from before the history existed has its own last-good spec taken as one of them.
        self.history = SpecHistory(state, wall_clock)
        self._seed = read.memory.last_good
        if not dry_run:
            try:
                self.history.record(cluster, seed=self._seed)
            except OSError as exc:
                self.log.error("spec_history_unwritten", error=str(exc.strerror or exc))
        self.memory = self._vetted(self.memory, "state dir")
        # Progress for the watchdog and /healthz: a cycle finished, or an action is running.
        self.progress_at = monotonic()
        self.action_deadline: float | None = None
        # While a look runs: when it must have ended, by its own timeouts.
        self.observe_deadline: float | None = None

    @property
    def memory(self) -> Memory:
        """Memory now (`MemoryNow` owns it)."""
        return self.now.value

    @memory.setter
    def memory(self, memory: Memory) -> None:
        self.now.value = memory

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"at": self.wall_clock(), "cluster": self.cluster.name, "kind": kind, **fields}

    def _note(self, kind: str, fields: dict[str, Any]) -> bool:
        """Persist memory with one event and wake the loop; True when it is on disk."""
        saved = self.persistence.save(self.memory, [self._event(kind, **fields)])
        self.wake.set()
        return saved

    def _stir(self) -> None:
        self._stirred = True
        self.wake.set()

    # -- one cycle ----------------------------------------------------------------------

    def _probe_due(self, endpoint: ModelEndpoint) -> bool:
        return probe_due(self.cluster, self.memory, endpoint, self.clock.now())

    async def cycle(self) -> Plan:
        started = self.monotonic()
        # A ready Ray needs one `ray` call a look at most (none while its last reading stands); one
        # that is getting there also reads `ray status` (core.judging.ray_stage.needs_ray_status).
        ray_status = needs_ray_status(self.view.plan)
        known_ray = reusable_ray(
            self.view,
            stirred=self._stirred,
            read_at=self._ray_read_at,
            now=self.clock.now(),
            probe_interval=self.cluster.probe_interval,
        )
        self._stirred = False
        swept = None
        if self.fence is not None and self.may_act() and not self.dry_run:
            # A new owner's first step, before it looks: the former owner's commands still
            # running on a host finish first, and any later one of its is refused there.
            await self._adopt()
            unswept = {h.name for h in self.fence.unswept()}
            await self.fence.sweep()
            swept = self.fence.token()
            done = sorted(unswept - {h.name for h in self.fence.unswept()})
            if done and swept is not None:
                self._persist([self._event("fence_swept", hosts=done, token=swept.token)])
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
        self.now.look_began()
        self.view.clock_step = note_step(self.clock.noticed(), self.view.clock_step, self.log)
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
        if plan.reason != before.last_reason or plan.phase != before.last_phase:
            self.log.info("plan", phase=plan.phase, reason=plan.reason, actions=len(plan.actions))
        rebooted_hosts = rebooted(observed, before)
        events = self._reboot_events(rebooted_hosts)
        if plan.phase != before.last_phase:
            events.append(
                self._event("phase", phase=plan.phase, was=before.last_phase, reason=plan.reason)
            )
        self._say_dashboard_refused(observed)
        self.view.snapshot = observed
        self.view.plan = plan
        self.on_plan(self)
        cycle = CycleInProgress(before=before, observed=observed, plan=plan, events=events)
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
        self.now.cycle_ended()
        self.view.cycle_done(observed, plan, self.wall_clock())
        self.action_deadline = None
        self.progress_at = self.monotonic()
        probe = observed.probe if is_new_probe(before, observed.probe) else None
        if probe is not None and probe.verdict.healthy:
            self.view.probed(probe.outcome, self.clock.wall_of(probe.at))
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

    def _learn(self, cycle: CycleInProgress) -> None:
        """Memory as if the cycle ended now, persisted with the events so far."""
        now = self.clock.now()
        learnt = after_cycle(
            cycle.before,
            cycle.observed,
            cycle.outcomes,
            now,
            cycle.plan,
            self.cluster,
            wall=self.clock.wall_of(now),
        )
        for kind, fields in rollout_record.events(cycle.before.rollout, learnt.rollout):
            if kind not in cycle.rollout_noted:
                cycle.rollout_noted.add(kind)
                cycle.events.append(self._event(kind, **fields))
                self.log.warning(kind, **fields)
        # A pause or resume that landed while the cycle ran applies on top of what it learnt.
        self.now.learnt(learnt)
        adopted = self.memory.adopted
        if adopted is not None and cycle.before.adopted is None:
            # First contact took over a deployment made by hand (core.judging.adopt): what, by name.
            fields = {
                "containers": dict(adopted.containers),
                "serve_pid": adopted.serve_pid,
                "reason": cycle.plan.reason if cycle.plan is not None else "",
            }
            cycle.events.append(self._event("adopted", **fields))
            self.log.warning("adopted", **fields)
        blocked = self.memory.blocked
        if blocked is not None and cycle.before.blocked is None and not cycle.blocked_noted:
            cycle.blocked_noted = True
            cycle.events.append(self._event("blocked", reason=blocked.reason))
            self.log.error("blocked", reason=blocked.reason)
        events, cycle.events = cycle.events, []
        if not self.dry_run:  # a dry run changes nothing, its own state included
            self._persist(events)

    @property
    def persist_error(self) -> str | None:
        """Why the state dir took no writes at the latest try; None while writes succeed."""
        return self.persistence.error

    def _persist(self, events: list[dict[str, Any]]) -> bool:
        """True when memory and every event so far are on disk."""
        return self.persistence.save(self.memory, events)

    def maintenance_at(self, now: float) -> Window | None:
        return window_at(self.cluster.maintenance, now)

    def _effective(self, memory: Memory, now: float) -> Memory:
        return overlay(memory, self.cluster.maintenance, now)

    def _say_dashboard_refused(self, observed: Observed) -> None:
        if observed.ray is None:
            return  # not read this cycle: unknown, not a change
        refused = observed.ray.dashboard_refused
        if refused != self._dashboard_refused:
            if refused is not None:
                self.log.warning("ray_dashboard_refused", detail=refused)
            else:
                self.log.info("ray_dashboard_answers")
            self._dashboard_refused = refused

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

    async def _adopt(self) -> None:
        """A new owner continues from the store's memory; the former owner's last action, if
        its outcome never landed, is only known from the look that follows."""
        adopted = await self.store.adopt(self.cluster.name, self.memory, self.clock.now())
        if adopted is not None:
            # The former owner's looks are not this process's (core.deciding.gate
            # `inherited_memory`).
            memory = bounded(adopted.memory, self.clock.now()).evolve(
                clock=self.clock.anchor, observing_since=self.clock.now()
            )
            self.memory = self._vetted(memory, adopted.source)
            unknown = (
                [self._event("intent_unknown", intent=adopted.intent)] if adopted.intent else []
            )
            self._persist([self._event("memory_adopted", source=adopted.source), *unknown])
            await self.store.continued(self.cluster.name)

    def _vetted(self, memory: Memory, source: str) -> Memory:
        """`memory` with its last-good spec as this box's history holds it; refused (latched,
        said in an event and the log) when it names a spec no config here ran
        (core.deciding.known_specs)."""
        known = self.history.known(self.cluster.name, seed=self._seed)
        vetted, refused = known_specs.vet(self.cluster, memory, known, self.clock.now())
        if refused is not None:
            self.log.error("memory_spec_refused", source=source, reason=refused)
            self.memory = vetted
            self._persist(
                [
                    self._event("spec_refused", source=source, reason=refused),
                    self._event("blocked", reason=refused),
                ]
            )
        return vetted

    def _action_finished(self, outcome: ActionOutcome) -> None:
        self.store.settled(self.cluster.name)
        self.view.recent.appendleft(outcome)
        self.view.in_flight = None
        self.action_deadline = None
        self.progress_at = self.monotonic()
        action = outcome.action
        # What the event journal and the log both say of it.
        what = dict(
            action=action.kind, host=action.host, target=action.target, result=outcome.result
        )
        cycle = self._cycle
        if cycle is not None:
            cycle.outcomes.append(outcome)
            cycle.events.append(
                self._event("remediation", **what, reason=action.reason, detail=outcome.detail)
            )
            self._learn(cycle)
        log = self.log.info if outcome.result == "ok" else self.log.warning
        seconds = round(outcome.finished_at - outcome.started_at, 3)
        log("action", **what, detail=outcome.detail, seconds=seconds)
        self.on_action(self, outcome)

    def _reboot_events(self, hosts: list[str]) -> list[dict[str, Any]]:
        for host in hosts:
            self.log.warning("reboot_detected", host=host)
        return [self._event("reboot", host=host) for host in hosts]

    def next_look(self, acted: bool = False) -> NextLook:
        """When to look again with no event (runtime.next_look)."""
        wall = self.wall_clock()
        window = self.maintenance_at(wall)
        return next_look(
            self.view.plan,
            acted=acted,
            failed=self.view.last_error is not None,
            interval=self.cluster.interval,
            recheck_interval=self.cluster.recheck_interval,
            now=self.clock.now(),
            window_ends_in=None if window is None else window.end - wall,
        )

    def next_delay(self) -> float:
        return self.next_look().delay

    # -- the loop -----------------------------------------------------------------------

    def _woken(self, host: str, why: str) -> None:
        """A host's event stream says something changed: look again now (coalesced: one wake
        covers every event until the next cycle starts)."""
        if not self.wake.is_set():
            self.log.info("woken", host=host, why=why)
        self._stirred = True
        self.wake.set()

    async def run(self) -> None:
        watch = (
            EventWatch(self.cluster, self.pool, self._woken, counts=self.event_counts)
            if self.watch_events
            else None
        )
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
                self.log.exception("cycle_failed")
                # The loop goes on: for the watchdog that is progress; /healthz names it. Stamped
                # after the traceback is written, which a starved machine can take seconds over.
                self.progress_at = self.monotonic()
                self.on_record(self, CycleRecord(ok=False, seconds=self.monotonic() - started))
            if self.stopping:
                break
            look = self.next_look(acted)
            self.log.debug("next_look", seconds=round(look.delay, 3), why=look.why)
            if look.at_once:
                continue
            ended = self.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=look.delay)
            rest = wake_rest(self.cluster.recheck_interval) - (self.monotonic() - ended)
            if rest > 0 and not self.stopping:
                await asyncio.sleep(rest)

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()

    def healthy(self, now: float) -> tuple[bool, str]:
        """For the watchdog and /healthz: this controller makes progress (runtime.cluster_view)."""
        return liveness(
            now,
            action_deadline=self.action_deadline,
            observe_deadline=self.observe_deadline,
            progress_at=self.progress_at,
            interval=self.cluster.interval,
        )
