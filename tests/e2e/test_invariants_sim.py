"""Invariants 4, 7 and 9 against the simulated world, at the real ratios of its timing: only
actions that can apply, silent stages capped on their own, one Ray read per look during a load."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from sparkd.model.plan import Plan
from sparkd.runtime.controller import Controller
from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.e2e.conftest import controller, converge, mutations

NEW_TAG = "vllm/vllm-openai:v0.33.0"


async def cycles(ctl: Controller, count: int) -> list[Plan]:
    return [await ctl.cycle() for _ in range(count)]


async def cycle_until(ctl: Controller, done: str, limit: int = 300) -> list[Plan]:
    plans = []
    for _ in range(limit):
        plan = await ctl.cycle()
        plans.append(plan)
        if done in plan.reason or plan.phase == done:
            return plans
    raise AssertionError(f"never {done!r}: {plans[-1].phase}: {plans[-1].reason}")


def launches(world: World, since: float) -> list[str]:
    return [r.command for r in mutations(world, "spark-a", since) if "vllm serve" in r.command]


def docker_runs(world: World, host: str, since: float) -> list[str]:
    return [r.command for r in mutations(world, host, since) if r.command.startswith("docker run")]


async def test_a_hung_capture_burning_cpu_is_restarted_after_its_cap_not_load_timeout(
    tmp_path: Path, pool: SshPool
) -> None:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        ctl = controller(world, pool, tmp_path / "state")
        model = ctl.cluster.model
        await converge(ctl, cycles=200)
        since = time.time()
        await world.fault("hang-capture", "spark-a")
        await world.fault("crash-model", "spark-a")
        plans = await cycle_until(ctl, "silent stage")
        restarted_at = time.time()
        restart = [a for p in plans for a in p.actions if "silent stage" in a.reason]
        assert len(restart) == 1 and "CUDA-graph capture" in restart[0].reason
        # The hung launch, then the one that replaced it (run in the same cycle).
        hung_launch = [r for r in mutations(world, "spark-a", since) if "vllm serve" in r.command]
        assert len(hung_launch) == 2
        took = restarted_at - hung_launch[0].at
        # Its CPU kept rising, so load_stall never fired; its own cap did, long before the
        # load's timeout.
        assert not any("load stalled" in a.reason for p in plans for a in p.actions)
        assert model.graph_capture_timeout < took < model.load_timeout, took
        final = await converge(ctl, cycles=300)
        assert final[-1].phase == "healthy"
        assert len(launches(world, since)) == 2


async def test_an_orphaned_engine_holds_the_launch_until_ray_takes_it_away(
    tmp_path: Path, pool: SshPool
) -> None:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        ctl = controller(world, pool, tmp_path / "state")
        await converge(ctl, cycles=200)
        since = time.time()
        await world.fault("orphan-engine", "spark-a")
        plans = await cycle_until(ctl, "engine processes still hold the GPUs")
        assert "VLLM::EngineCore" in plans[-1].reason
        plans += await converge(ctl, cycles=300)
        # No launch while the engine held the GPUs: Ray went first (head, then the worker),
        # and the one launch after it loaded.
        kinds = [a.kind for p in plans for a in p.actions]
        assert kinds.index("restart_ray") < kinds.index("start_model"), kinds
        assert kinds.count("start_model") == 1, kinds
        assert len(docker_runs(world, "spark-a", since)) == 1
        assert len(docker_runs(world, "spark-b", since)) == 1
        assert len(launches(world, since)) == 1
        assert plans[-1].phase == "healthy"


async def test_nothing_starts_on_a_full_disk_until_space_is_freed(
    tmp_path: Path, pool: SshPool
) -> None:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        ctl = controller(world, pool, tmp_path / "state")
        await converge(ctl, cycles=200)
        since = time.time()
        await world.fault("full-disk", "spark-a", "65536")
        await world.fault("crash-model", "spark-a")
        plans = await cycle_until(ctl, "disk full on spark-a (65536 bytes free)")
        plans += await cycles(ctl, 20)
        assert all(p.actions == () for p in plans), [p.reason for p in plans if p.actions]
        assert plans[-1].phase == "blocked"
        assert mutations(world, since=since) == []
        await world.fault("heal", "spark-a")
        final = await converge(ctl, cycles=300)
        assert final[-1].phase == "healthy"
        assert len(launches(world, since)) == 1


async def test_a_lost_gpu_blocks_with_reboot_and_a_reboot_recovers(
    tmp_path: Path, pool: SshPool
) -> None:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        ctl = controller(world, pool, tmp_path / "state")
        await converge(ctl, cycles=200)
        since = time.time()
        await world.fault("lost-gpu", "spark-b")
        await world.fault("crash-model", "spark-a")
        plans = await cycle_until(ctl, "the GPU of spark-b is lost: needs a reboot of")
        plans += await cycles(ctl, 20)
        assert all(p.actions == () for p in plans), [p.reason for p in plans if p.actions]
        assert plans[-1].phase == "blocked"
        assert "Unable to determine the device handle" in plans[-1].reason
        assert mutations(world, since=since) == []
        await world.fault("reboot", "spark-b")
        final = await converge(ctl, cycles=400)
        assert final[-1].phase == "healthy"


async def test_a_new_tag_rolls_once_ray_then_model_when_every_host_has_it(
    tmp_path: Path, pool: SshPool
) -> None:
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        await converge(controller(world, pool, tmp_path / "state"), cycles=200)
        since = time.time()
        await world.fault("pull-image", "spark-a", NEW_TAG)
        # The operator moves the config to the new tag, pulled on one host so far.
        ctl = controller(world, pool, tmp_path / "state", cluster={"ray": {"image": NEW_TAG}})
        plans = await cycles(ctl, 20)
        assert all(p.actions == () for p in plans), [p.reason for p in plans if p.actions]
        assert f"image {NEW_TAG} missing on spark-b" in plans[-1].reason
        assert "waits until the image" in plans[-1].reason
        assert mutations(world, since=since) == []
        await world.fault("pull-image", "spark-b", NEW_TAG)
        final = await converge(ctl, cycles=400)
        assert final[-1].phase == "healthy"
        assert len(docker_runs(world, "spark-a", since)) == 1
        assert len(docker_runs(world, "spark-b", since)) == 1
        assert len(launches(world, since)) == 1
        assert all(NEW_TAG in run for run in docker_runs(world, "spark-a", since))


async def test_a_load_on_a_ready_ray_reads_ray_once_per_look(tmp_path: Path, pool: SshPool) -> None:
    timing = dataclasses.replace(Timing.fast(), model_load=20.0)
    async with World(tmp_path / "world", scenario="seed-morning", timing=timing) as world:
        ctl = controller(world, pool, tmp_path / "state")
        await converge(ctl, cycles=300)
        await world.fault("crash-model", "spark-a")
        await cycle_until(ctl, "loading")
        since, looks = time.time(), 0
        for _ in range(20):
            plan = await ctl.cycle()
            looks += 1
            if plan.phase != "loading":
                break
        until = time.time()
        assert looks >= 10, plan.reason
        calls = [
            r
            for r in world.commands("spark-a")
            if since <= r.at <= until and r.command.split()[:1] == ["ray"]
        ]
        assert len(calls) <= looks, [r.command for r in calls]
        assert not any(r.command.startswith("ray status") for r in calls)
