"""Invariant 1, time: only durations that something vouches for decide.

The real Controller runs against the toy cluster (its observation and its actions swapped for
the toy's, nothing else), with the ops box's wall clock and monotonic clock injected. The toy
reports what real hosts report: container and process ages, which the observation turns into
daemon time as `observed_at - age`. Stepping the wall clock by any amount, with or without a
daemon restart at the step, must add no destructive action and delay no counted probe, action
(a backoff's end) or latch by more than one recheck, against the same run without the step.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from unittest import mock

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.model.memory import Attempt, GoodSpec, LoadMark, Memory, Rollout
from sparkd.model.observed import Observed, RayNode, RayState
from sparkd.model.plan import Action, ActionOutcome, Plan
from sparkd.runtime.cluster_view import CycleRecord
from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.shell.ssh import SshPool
from tests.examples import EXAMPLE_SET
from tests.toy import Toy

# Real Ray keeps a killed node ALIVE for ~15 s before it drops it.
LINGER = 15.0
RUN_FOR = 900.0
MONO_AT_START = 86_400.0


def _example(name: str) -> tuple[Toy, Memory]:
    return next(e for e in EXAMPLE_SET if e.name == name).build()


def _healthy() -> tuple[Toy, Memory]:
    """Healthy, with Ray as sparkd started it: each node first seen seconds after its
    container started."""
    toy, memory = _example("healthy-reasoning-only")
    started = {
        host.name: box.started_at
        for host in toy.cluster.hosts
        for box in toy.containers[host.name].values()
        if box.started_at is not None
    }
    seen = {
        node.node_id: started[host.name] + 3.0
        for host in toy.cluster.hosts
        for node in toy.ray_nodes
        if node.ip == host.ip
    }
    return toy, memory.model_copy(update={"ray_seen": seen, "ray_started": started})


def _loading() -> tuple[Toy, Memory]:
    toy, memory = _example("loading-40pct")
    toy.load_seconds = 420.0
    return toy, memory


def _settling() -> tuple[Toy, Memory]:
    """A worker's Ray container died: sparkd starts it and waits for a new node id while the
    old one lingers ALIVE."""
    return _example("one-gpu-of-two")


def _failing() -> tuple[Toy, Memory]:
    """A model that was healthy and now fails every probe: counted, restarted, backed off."""
    toy, memory = _healthy()
    toy.probe_style = "http_error"
    toy.load_seconds = 120.0
    return toy, memory


SCENARIOS: dict[str, Callable[[], tuple[Toy, Memory]]] = {
    "healthy": _healthy,
    "loading": _loading,
    "settling": _settling,
    "failing": _failing,
}


@dataclass
class Run:
    """What one run did, on the toy's (true) timeline."""

    actions: list[tuple[float, str, str]] = field(default_factory=list)
    probes: list[float] = field(default_factory=list)
    latched_at: float | None = None


class Clocked:
    """The toy cluster behind a real Controller whose clocks the test sets."""

    def __init__(self, toy: Toy, memory: Memory, state: Path) -> None:
        self.toy = toy
        self.t0 = toy.now
        self.step = 0.0
        self.lingering: list[tuple[float, RayNode]] = []
        self.state = StateDir(state)
        self.state.save_memory(toy.cluster.name, memory)
        self.run = Run()
        self.controller = self._controller()

    def wall(self) -> float:
        return self.toy.now + self.step

    def mono(self) -> float:
        return self.toy.now - self.t0 + MONO_AT_START

    def _controller(self) -> Controller:
        controller = Controller(
            self.toy.cluster,
            cast(SshPool, None),
            self.state,
            wall_clock=self.wall,
            monotonic=self.mono,
            watch_events=False,
            on_record=self._record,
        )
        controller.executor.run = self._execute  # type: ignore[method-assign]
        return controller

    def restart(self) -> None:
        self.controller = self._controller()

    def _record(self, controller: Controller, record: CycleRecord) -> None:
        if record.probe is not None:
            self.run.probes.append(self.toy.now)
        if controller.memory.blocked is not None and self.run.latched_at is None:
            self.run.latched_at = self.toy.now

    async def _execute(self, plan: Plan, should_stop: Callable[[], bool]) -> list[ActionOutcome]:
        executor = self.controller.executor
        outcomes = []
        for action in plan.actions:
            executor.on_start(action)
            started = executor.wall_clock()
            self._apply(action)
            outcome = ActionOutcome(
                action=action, result="ok", started_at=started, finished_at=executor.wall_clock()
            )
            self.run.actions.append((self.toy.now, action.kind, action.host))
            executor.on_finish(outcome)
            outcomes.append(outcome)
        return outcomes

    def _apply(self, action: Action) -> None:
        host = self.toy.cluster.host(action.host)
        before = [n for n in self.toy.ray_nodes if n.ip == host.ip and n.alive]
        self.toy.apply(action)
        if action.kind in ("start_ray_head", "start_ray_worker", "restart_ray"):
            self.lingering.extend((self.toy.now + LINGER, node) for node in before)

    async def observe(
        self,
        cluster: Any,
        pool: Any,
        *,
        probe_due: Callable[[Any], bool],
        wall_clock: Callable[[], float],
        ray_status: bool = True,
        known_ray: RayState | None = None,
        checks_due: bool = False,
        prepare: bool = False,
    ) -> Observed:
        self.lingering = [(until, n) for until, n in self.lingering if until > self.toy.now]
        seen = self.toy.observe()
        at = wall_clock()
        shift = at - self.toy.now
        hosts = tuple(
            h.model_copy(
                update={
                    "containers": tuple(
                        c.model_copy(update={"started_at": c.started_at + shift})
                        if c.started_at is not None
                        else c
                        for c in h.containers
                    )
                }
            )
            for h in seen.hosts
        )
        ray = seen.ray
        if ray is not None and ray.up and self.lingering:
            nodes = ray.nodes + tuple(n for _, n in self.lingering)
            ray = RayState(nodes=nodes, gpus_total=sum(n.gpus for n in nodes if n.alive))
        if known_ray is not None:
            ray = known_ray.model_copy(update={"reused": True})
        serve = seen.serve
        if serve is not None and serve.progress is not None:
            progress = serve.progress
            moved = None if progress.progress_at is None else progress.progress_at + shift
            serve = serve.model_copy(
                update={"progress": progress.model_copy(update={"progress_at": moved})}
            )
        probe = seen.probe
        if probe is not None and seen.endpoint is not None and probe_due(seen.endpoint):
            probe = probe.model_copy(update={"at": at})
        else:
            probe = None
        return seen.model_copy(
            update={
                "observed_at": at,
                "hosts": hosts,
                "ray": ray,
                "serve": serve,
                "probe": probe,
            }
        )

    def go(self, until: float, step_at: float, delta: float, restart: bool) -> Run:
        with mock.patch("sparkd.runtime.controller.observe", self.observe):
            asyncio.run(self._loop(until, step_at, delta, restart))
        return self.run

    async def _loop(self, until: float, step_at: float, delta: float, restart: bool) -> None:
        stepped = False
        while self.toy.now < until:
            if not stepped and self.toy.now >= step_at:
                stepped = True
                self.step = delta
                if restart:
                    self.restart()
            acted = bool((await self.controller.cycle()).actions)
            # As the controller's own loop: after actions look again at once (here one second
            # later), else after its delay.
            self.toy.advance(1.0 if acted else max(0.01, self.controller.next_delay()))


def run(scenario: str, step_at: float, delta: float, restart: bool) -> Run:
    toy, memory = SCENARIOS[scenario]()
    with tempfile.TemporaryDirectory() as tmp:
        clocked = Clocked(toy, memory, Path(tmp))
        return clocked.go(toy.now + RUN_FOR, toy.now + step_at, delta, restart)


@functools.cache
def unstepped(scenario: str) -> Run:
    """A scenario's run with no step and no restart: the same run whatever `step_at` (a step of
    0 s changes no clock), so it is made once per scenario instead of once per example."""
    return run(scenario, 0.0, 0.0, restart=False)


def check(scenario: str, step_at: float, delta: float, restart: bool) -> None:
    toy, _ = SCENARIOS[scenario]()
    slack = toy.cluster.recheck_interval
    base = run(scenario, step_at, 0.0, restart) if restart else unstepped(scenario)
    stepped = run(scenario, step_at, delta, restart)
    added = Counter((k, h) for _, k, h in stepped.actions) - Counter(
        (k, h) for _, k, h in base.actions
    )
    assert not added, f"the step added {dict(added)}: {stepped.actions} vs {base.actions}"
    for kind, host in {(k, h) for _, k, h in base.actions}:
        mine = [t for t, k, h in stepped.actions if (k, h) == (kind, host)]
        theirs = [t for t, k, h in base.actions if (k, h) == (kind, host)]
        for i, t in enumerate(theirs):
            late = mine[i] if i < len(mine) else float("inf")
            assert late <= t + slack, f"{kind} on {host} #{i + 1} delayed: {late - t:.0f}s"
    for i, t in enumerate(base.probes[:-1]):
        late = stepped.probes[i] if i < len(stepped.probes) else float("inf")
        assert late <= t + slack, f"counted probe #{i + 1} delayed by {late - t:.0f}s"
    if base.latched_at is not None:
        assert stepped.latched_at is not None
        assert stepped.latched_at <= base.latched_at + slack


STEP = st.floats(-7200.0, 7200.0).filter(lambda d: abs(d) >= 1.0)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    scenario=st.sampled_from(sorted(SCENARIOS)),
    step_at=st.floats(0.0, 300.0),
    delta=STEP,
    restart=st.booleans(),
)
@example(scenario="healthy", step_at=30.0, delta=20.0, restart=False)
@example(scenario="healthy", step_at=30.0, delta=-3600.0, restart=False)
def test_a_clock_step_changes_no_decision(
    scenario: str, step_at: float, delta: float, restart: bool
) -> None:
    check(scenario, step_at, delta, restart)


# -- named cases, each a failure the property found ---------------------------------------


def test_forward_step_of_20s_restarts_nothing_on_a_healthy_cluster() -> None:
    """Every Ray node looked older than its container: after join_timeout, Ray and the model
    were restarted on a healthy cluster."""
    check("healthy", 30.0, 20.0, restart=False)


def test_backward_step_does_not_suspend_probing() -> None:
    """A step back of an hour suspended probing (and failure counting) for the hour."""
    check("healthy", 30.0, -3600.0, restart=False)


def test_backward_step_keeps_a_30s_backoff_at_30s() -> None:
    check("failing", 60.0, -3600.0, restart=False)


def test_backward_step_does_not_tear_down_a_settling_ray() -> None:
    """The new node looked registered before its container started, for ever."""
    check("settling", 0.5, -200.0, restart=False)


def test_forward_step_across_a_restart_changes_no_duration() -> None:
    check("loading", 60.0, 1800.0, restart=True)


def test_a_restart_before_the_first_cycle_ends_keeps_daemon_time() -> None:
    """The anchor is written when it is set, not at the end of the first cycle: a restart
    in between (with the clock stepped) found none and took the stepped wall clock."""
    check("failing", 0.0, -60.0, restart=True)
    check("failing", 0.0, 5.0, restart=True)


def test_stamps_from_the_future_are_now() -> None:
    """Across a reboot of the ops box with the wall clock behind, a remembered stamp later
    than now is now: a backoff is not stretched by the step."""
    from sparkd.core.clock import bounded

    toy, memory = _failing()
    key = Action(
        kind="restart_model", host=toy.cluster.head.name, target=toy.cluster.model.id, reason=""
    ).key
    ahead = memory.evolve(
        attempts=(Attempt(key=key, at=toy.now + 3600, ok=True),), last_probe_at=toy.now + 3600
    )
    clamped = bounded(ahead, toy.now)
    assert clamped.attempts[0].at == toy.now
    assert clamped.last_probe_at == toy.now
    before = plan(toy.cluster, toy.observe(), ahead, toy.now)
    assert "backing off" not in before.reason or "until 30s from now" in before.reason


def test_rollout_and_fabric_stamps_from_the_future_are_now() -> None:
    """The rollout's stamps, the last-good spec's and the fabric hold's are daemon time like
    the others: ahead of now (the wall clock behind across a reboot), each is now."""
    from sparkd.core.clock import bounded

    toy, memory = _failing()
    later = toy.now + 3600
    ahead = memory.evolve(
        last_good=GoodSpec(hash="a", ray={}, model={}, at=later),
        rollout=Rollout(
            id=1,
            started=later,
            began_at=later,
            from_hash="a",
            to_hash="b",
            stopped_at=later,
            accepted_at=later,
            rolled_back_at=later,
            restored_at=later,
        ),
        fabric_held_since=later,
    )
    clamped = bounded(ahead, toy.now)
    record = clamped.rollout
    assert record is not None and clamped.last_good is not None
    stamps = (record.began_at, record.stopped_at, record.accepted_at, record.rolled_back_at)
    assert stamps == (toy.now,) * 4 and record.restored_at == toy.now
    assert clamped.last_good.at == toy.now and clamped.fabric_held_since == toy.now
    # `started` is the wall clock shown to operators, not daemon time.
    assert record.started == later
    for alone in (
        memory.evolve(rollout=Rollout(id=1, started=0, began_at=later, from_hash="a", to_hash="b")),
        memory.evolve(fabric_held_since=later),
    ):
        assert max(_stamps(bounded(alone, toy.now))) <= toy.now


def _stamps(memory: Memory) -> list[float]:
    rollout = memory.rollout
    found = [memory.fabric_held_since or 0.0]
    if rollout is not None:
        found.append(rollout.began_at)
    return found


def test_a_pause_ends_on_the_wall_clock() -> None:
    """An operator's `until` is wall clock: after a step the pause ends when the wall clock
    says, and the horizon puts that moment on daemon time."""
    from sparkd.model.memory import Pause

    toy, memory = _healthy()
    wall = toy.now - 3600.0  # the wall clock stepped back an hour since daemon time was set
    paused = memory.model_copy(
        update={"paused": Pause(reason="cable", by="ops", since=wall, until=wall + 60)}
    )
    seen = toy.observe()
    during = plan(toy.cluster, seen, paused, toy.now, wall=wall)
    assert during.phase == "paused"
    assert during.recheck_at is not None and during.recheck_at <= toy.now + 60
    after = plan(toy.cluster, seen, paused, toy.now + 61, wall=wall + 61)
    assert after.phase != "paused"


def test_a_load_stage_entered_in_the_future_is_now() -> None:
    """When the load entered its stage is daemon time: ahead of now, a silent-stage grace
    measured from it would never run out."""
    from sparkd.core.clock import bounded

    toy, memory = _failing()
    later = toy.now + 3600
    mark = LoadMark(launch=toy.now - 10, key="weights|40|", at=toy.now - 1, entered=later)
    clamped = bounded(memory.evolve(load_mark=mark), toy.now)
    assert clamped.load_mark is not None and clamped.load_mark.entered == toy.now
