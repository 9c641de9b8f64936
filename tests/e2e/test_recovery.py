"""The controller recovering the simulated cluster, checked in the world's own command log."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import after_its_own_launch, controller, converge, eventually, mutations
from tests.support.worlds import both_servers


def kinds(plans: list) -> list[str]:  # type: ignore[type-arg]
    return [a.kind for p in plans for a in p.actions]


@both_servers
async def test_cold_start_from_seed_morning(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(seed_world, pool, tmp_path / "state")
    plans = await converge(ctl)
    assert kinds(plans) == ["stop_unit"] * 4 + ["remove_container"] * 2 + [
        "start_ray_head",
        "start_ray_worker",
        "start_model",
    ]
    final = plans[-1]
    assert final.phase == "healthy"
    assert ctl.view.snapshot is not None and ctl.view.snapshot.probe is not None
    assert ctl.view.snapshot.probe.verdict.outcome == "reasoning_only"
    assert ctl.view.snapshot.probe.verdict.completion_tokens == 50
    assert all(o.result == "ok" for o in ctl.view.recent)

    # The operator's steps, in order, and nothing else changed anything on a host.
    changed = [r.command for r in mutations(seed_world)]
    stops = [c for c in changed if c.startswith("systemctl")]
    assert stops == [
        f"systemctl {verb} -- {unit}"
        for unit in (
            "vllm-cluster.service",
            "vllm-proxy.service",
            "vllm-embeddings.service",
            "vllm-reranker.service",
        )
        for verb in ("stop", "disable")
    ]
    runs = [c for c in changed if c.startswith("docker run")]
    assert len(runs) == 2
    assert "--head" in runs[0] and "--address=" in runs[1]
    serves = [c for c in changed if c.startswith("vllm serve")]
    assert len(serves) == 1
    first_run = changed.index(runs[0])
    assert all(changed.index(s) < first_run for s in stops)
    assert changed.index(serves[0]) > changed.index(runs[1])
    removals = [c for c in changed if c.startswith("docker rm")]
    assert sorted(removals)[:2] == ["docker rm -f -- glm-flash", "docker rm -f -- glm-flash"]


async def test_once_on_healthy_runs_nothing(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(healthy_world, pool, tmp_path / "state")
    since = await after_its_own_launch(healthy_world)
    plans = await converge(ctl)
    assert all(p.actions == () for p in plans)
    assert plans[-1].phase == "healthy"
    assert mutations(healthy_world, since=since) == []


async def recover_after(world: World, pool: SshPool, state: Path, fault: str, host: str) -> list:  # type: ignore[type-arg]
    ctl = controller(world, pool, state)
    await converge(ctl)
    await world.fault(fault, host)
    # The fault needs a moment to be observable (a reboot drops SSH at once).
    plans = await converge(ctl, cycles=120)
    return plans


@both_servers
async def test_worker_reboot_recovers(seed_world: World, pool: SshPool, tmp_path: Path) -> None:
    plans = await recover_after(seed_world, pool, tmp_path / "s", "reboot", "spark-b")
    assert "start_ray_worker" in kinds(plans)
    assert any("spark-b rebooted" in p.reason or p.phase == "unreachable" for p in plans)
    assert plans[-1].phase == "healthy"


@both_servers
async def test_head_reboot_recovers(seed_world: World, pool: SshPool, tmp_path: Path) -> None:
    plans = await recover_after(seed_world, pool, tmp_path / "s", "reboot", "spark-a")
    done = kinds(plans)
    assert (
        "start_ray_head" in done
        and "restart_ray" in done
        and ("start_model" in done or "restart_model" in done)
    )
    assert done.index("start_ray_head") < done.index("restart_ray")


@both_servers
async def test_model_crash_recovers(seed_world: World, pool: SshPool, tmp_path: Path) -> None:
    plans = await recover_after(seed_world, pool, tmp_path / "s", "crash-model", "spark-a")
    assert kinds(plans) == ["start_model"]


async def test_probe_failures_restart_once_then_block(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(seed_world, pool, tmp_path / "s", cluster={"policy": {"budget": 1}})
    await converge(ctl)
    await seed_world.fault("answer-style", "spark-a", "http_500")
    phases = []
    for _ in range(80):
        plan = await ctl.cycle()
        phases.append(plan.phase)
        if plan.phase == "blocked":
            break
        await asyncio.sleep(0.1)
    restarts = [o for o in ctl.view.recent if o.action.kind == "restart_model"]
    assert len(restarts) == 1, phases
    assert phases[-1] == "blocked"
    assert ctl.memory.blocked is not None
    before = len(mutations(seed_world))
    for _ in range(3):
        plan = await ctl.cycle()
        assert plan.phase == "blocked" and plan.actions == ()
    assert len(mutations(seed_world)) == before
    ctl.requests.resume("test")
    await seed_world.fault("heal", "spark-a")
    plans = await converge(ctl)
    assert plans[-1].phase == "healthy"


async def test_dry_run_and_pause_change_nothing(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    dry = controller(seed_world, pool, tmp_path / "dry", dry_run=True)
    plan = await dry.cycle()
    assert plan.actions == () and len(plan.withheld) == 8
    assert plan.reason.startswith("dry-run: ")
    paused = controller(seed_world, pool, tmp_path / "paused")
    paused.requests.pause("maintenance window", "alice", None)
    plan = await paused.cycle()
    assert plan.phase == "paused" and plan.actions == ()
    assert mutations(seed_world) == []


async def test_progressing_load_is_left_alone_and_a_stalled_one_restarted_once(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(seed_world, pool, tmp_path / "s", cluster={"model": {"load_stall": 0.6}})
    await converge(ctl)
    # A slow load that keeps progressing: longer than load_stall in all, never restarted.
    await seed_world.fault("slow-load", "spark-a")
    await seed_world.fault("crash-model", "spark-a")
    plans = await converge(ctl, cycles=200)
    assert kinds(plans) == ["start_model"]
    assert "loading" in [p.phase for p in plans]
    await seed_world.fault("heal", "spark-a")
    # A load that stops at 40%: restarted once after load_stall, then it completes.
    await seed_world.fault("stall-load", "spark-a")
    await seed_world.fault("crash-model", "spark-a")
    plans = await converge(ctl, cycles=200)
    assert kinds(plans) == ["start_model", "restart_model"]
    restart = next(p for p in plans if p.actions and p.actions[0].kind == "restart_model")
    assert restart.reason.startswith("load stalled: no progress for")
    assert "weights 38%" in restart.reason  # shard 15 of 39, where the load stopped
    # The restart stopped the stalled serve inside its container (docker access is enough),
    # never with a host-level kill that needs root.
    commands = [r.command for r in seed_world.commands("spark-a") if r.source == "tool"]
    assert any(c.startswith("docker exec sparkd-sparks-ray-head sh -c") for c in commands)
    assert not any(c.split()[:1] == ["kill"] for c in commands)


async def test_pause_during_a_cycle_holds_the_remaining_actions_and_sticks(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(seed_world, pool, tmp_path / "s")
    cycle = asyncio.create_task(ctl.cycle())
    await eventually(lambda: ctl.view.in_flight is not None, within=10, poll=0.001)
    ctl.requests.pause("stop right there", "oncall", None)
    plan = await cycle
    assert len(plan.actions) == 8
    assert 1 <= len(ctl.view.recent) < 8
    assert ctl.memory.paused is not None and ctl.memory.paused.by == "oncall"
    saved = ctl.state.read_memory("sparks", time.time()).memory
    assert saved.paused is not None
    again = await ctl.cycle()
    assert again.phase == "paused" and again.actions == ()


async def test_first_probe_of_a_launch_is_not_held_back_by_the_probe_interval(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(
        seed_world,
        pool,
        tmp_path / "s",
        cluster={"probe_interval": 60.0, "probe": {"timeout": 1.0}},
    )
    plans = await converge(ctl, cycles=80)
    assert plans[-1].phase == "healthy"
    # And between probes it stays healthy instead of flapping to `probing`.
    again = await ctl.cycle()
    assert again.phase == "healthy" and again.converged
    assert ctl.view.snapshot is not None and ctl.view.snapshot.probe is None
