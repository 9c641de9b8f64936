"""Event-driven detection against the simulated world: `docker events` over the persistent SSH
connection wakes the controller, long before its interval would have."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from sparkd.model.plan import ActionOutcome
from sparkd.runtime.controller import Controller
from sparkd.shell.events import ContainerEvent, parse_event, relevant
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.e2e.conftest import controller, running
from tests.toy import reference_cluster

# Far longer than any test here runs: only an event can bring the next cycle.
INTERVAL = 600.0


@contextlib.asynccontextmanager
async def converged_daemon(
    world: World, pool: SshPool, state: Path
) -> AsyncIterator[tuple[Controller, list[ActionOutcome]]]:
    """The controller's own loop, run until converged and settled into its long wait."""
    # The probe too: a probe falling due is a reason to look (the plan's horizon).
    ctl = controller(world, pool, state, cluster={"interval": INTERVAL, "probe_interval": INTERVAL})
    outcomes: list[ActionOutcome] = []
    ctl.on_action = lambda _, outcome: outcomes.append(outcome)
    async with running(ctl):
        await until(lambda: ctl.view.plan is not None and ctl.view.plan.converged, 60)
        await asyncio.sleep(0.5)
        yield ctl, outcomes


async def until(check: Callable[[], bool], within: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if check():
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {within}s")


async def test_a_crashed_serve_process_is_handled_on_its_event(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    async with converged_daemon(seed_world, pool, tmp_path / "state") as (_, outcomes):
        done = len(outcomes)
        await seed_world.fault("crash-model", "spark-a")
        took = await until(lambda: any(o.action.kind == "start_model" for o in outcomes[done:]), 20)
        assert took < INTERVAL / 10


async def test_a_killed_ray_container_and_a_rebooted_host_are_handled_on_events(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    async with converged_daemon(seed_world, pool, tmp_path / "state") as (ctl, outcomes):
        done = len(outcomes)
        await seed_world.fault("kill-container", "spark-b", "sparkd-sparks-ray-worker")
        await until(lambda: any(o.action.kind == "start_ray_worker" for o in outcomes[done:]), 20)
        await until(lambda: ctl.view.plan is not None and ctl.view.plan.converged, 60)
        await asyncio.sleep(0.5)
        done = len(outcomes)
        await seed_world.fault("reboot", "spark-b")
        # The stream drops with the host; the stream set up anew after the reboot sees the GLM
        # container start again, and sparkd acts without waiting for its interval.
        await until(lambda: any(o.action.host == "spark-b" for o in outcomes[done:]), 30)


def test_events_are_parsed_and_filtered_like_dockers_json() -> None:
    cluster = reference_cluster()
    line = (
        '{"status":"die","id":"ab","from":"img","Type":"container","Action":"die",'
        '"Actor":{"ID":"ab","Attributes":{"exitCode":"137","name":"sparkd-sparks-ray-worker"}},'
        '"scope":"local","time":1,"timeNano":1}'
    )
    event = parse_event(line)
    assert event == ContainerEvent(action="die", name="sparkd-sparks-ray-worker")
    assert relevant(cluster, event)
    assert not relevant(cluster, ContainerEvent(action="die", name="someone-elses"))
    assert not relevant(cluster, ContainerEvent(action="attach", name="sparkd-sparks-ray-head"))
    for garbage in ("", "not json", "[]", '{"Actor": 5}', '{"Action": "die", "Actor": {}}'):
        assert parse_event(garbage) is None


async def test_sparkds_own_execs_do_not_wake_it(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """Every cycle's `docker exec HEAD ray list nodes` ends in an `exec_die` event: a converged
    cluster must still wait out its interval, not observe itself without end."""
    async with converged_daemon(seed_world, pool, tmp_path / "state") as (ctl, _):
        cycles = ctl.view.cycles
        await asyncio.sleep(3.0)
        assert ctl.view.cycles - cycles <= 1


def test_exec_events_wake_for_the_serve_process_only() -> None:
    from sparkd.shell.events import ExecFilter

    execs = ExecFilter()
    head = "sparkd-sparks-ray-head"
    read = ContainerEvent("exec_start", head, "e1", "ray list nodes --format=json")
    assert not execs.wakes(read)
    assert not execs.wakes(ContainerEvent("exec_die", head, "e1"))
    serve = ContainerEvent("exec_start", head, "e2", "sh -c echo $$ > /x; exec vllm serve /m")
    assert not execs.wakes(serve)
    assert execs.wakes(ContainerEvent("exec_die", head, "e2"))
    # An exec that started before the stream (the serve of an earlier launch) wakes when it ends.
    assert execs.wakes(ContainerEvent("exec_die", head, "e0"))
    assert execs.wakes(ContainerEvent("die", head))


async def test_a_quiet_converged_cluster_reads_ray_with_each_probe_not_each_cycle(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """A `ray` call costs the head 0.6-3 s of a core. Converged and quiet, Ray's last reading
    stands in until the next probe falls due; an event sends the next cycle back to Ray."""
    ctl = controller(
        healthy_world,
        pool,
        tmp_path / "state",
        cluster={"interval": 0.2, "probe_interval": 2.0},
    )
    async with running(ctl):
        await until(lambda: ctl.view.plan is not None and ctl.view.plan.converged, 30)
        since, first = time.time(), ctl.view.cycles
        await until(lambda: ctl.view.cycles - first >= 15, 45)
        cycles, elapsed = ctl.view.cycles - first, time.time() - since
        ray_calls = [
            r
            for r in healthy_world.commands("spark-a")
            if r.at >= since and r.command.split()[:1] == ["ray"]
        ]
        # One read per probe interval (2 s), give or take the one in flight; not one a cycle.
        assert len(ray_calls) <= elapsed / 2.0 + 2, (len(ray_calls), cycles, elapsed)
        assert len(ray_calls) < cycles, (len(ray_calls), cycles, elapsed)
        assert ctl.view.plan is not None and ctl.view.plan.converged
        # A killed worker container: the event brings a cycle that reads Ray again and acts.
        await healthy_world.fault("kill-container", "spark-b", "sparkd-sparks-ray-worker")
        await until(lambda: ctl.view.plan is not None and not ctl.view.plan.converged, 10)
        await until(lambda: ctl.view.plan is not None and ctl.view.plan.converged, 60)
